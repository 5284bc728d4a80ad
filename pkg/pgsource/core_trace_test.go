package pgsource

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// TestCoreTraces runs the scripts in testdata/core: each drives one WAL
// core (core.go) with pgoutput messages as the session would hand them
// over, and prints every action it returns and, after each command, its
// state (the chain, the open transaction, the journal and WAL end, each
// subscription's progress). The core's invariants are checked after every
// command. Rewrite the expectations with
// `go test ./pkg/pgsource -run TestCoreTraces -rewrite` and read the diff.
//
// A ts prints as milliseconds.logical (commit times are small integers of
// milliseconds: ts(i) = max(ts(i-1) + 2, ms << 18)).
//
// Commands:
//
//	new [from=LSN/MS.L] [chunk-rows=N]      a core for a session from a saved position
//	known oid=N name=T cols=c[:key],... [identity=full|none]   a relation version known before the stream (Open's)
//	sub oid=N [start=MS.L] [have=MS.L]      a subscription, handed over at the next begin
//	                                        (a tick sees it at once, as the shell's does)
//	begin time=MS xid=N                     BEGIN
//	relation oid=N name=T cols=c[:key],... [identity=...]  a Relation message and the description the shell read
//	insert oid=N c=v ...                    an insert (values in column order)
//	update oid=N c=v ... [old=c=v;...] [full] [unchanged=c]
//	delete oid=N c=v ... [full]             a delete (key values; full: the whole old row)
//	truncate oids=N,...
//	commit lsn=N
//	heartbeat
//	keepalive wal-end=N
//	tick                                    resolve every subscription to the last commit
//	confirm [saved=LSN/MS.L] safe=MS.L|unknown [holds=MS.L,...]   nextConfirm (prints, changes nothing)
//	confirmed lsn=N                         the slot was confirmed there (the journal trims)
//	chunk id=ID oid=N [first] [fresh] [final] [last] [rows=k:v,...] [xip=N,...] [not-ready]   the copier registers a chunk
//	      [keyless xmin=N xmax=N]           a keyless table's (copy_keyless.go), with its snapshot
//	low id=ID | high id=ID                  a copy watermark in the stream
//	given-up id=ID                          the copier gives a chunk up
//	live timeout=D | live-step elapsed=D [heard]   the liveness decider (liveness.go)
//	reseed confirmed=LSN [saved=LSN/MS.L]   a session's start when the slot was confirmed to LSN
//	                                        (saved: the position another process saved there)
func TestCoreTraces(t *testing.T) {
	datadriven.Walk(t, "testdata/core", func(t *testing.T, path string) {
		var w *traceCore
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd == "new" {
				w = newTraceCore(t, d)
				return w.dump()
			}
			require.NotNil(t, w, "%s: the script must start with new", d.Pos)
			out, err := w.run(t, d)
			if err != nil {
				out += "error: " + err.Error() + "\n"
			}
			for _, a := range w.c.take() {
				out += w.fmtAction(a) + "\n"
			}
			w.checkInvariants(t)
			if d.Cmd == "confirm" || strings.HasPrefix(d.Cmd, "live") {
				return out
			}
			return out + w.dump()
		})
	})
}

type traceCore struct {
	c      *core
	pend   map[uint32][]*sub // subscriptions handed over at the next begin
	subs   map[uint32][]*sub
	names  map[uint32]string
	chunks map[string]*copyChunk
	live   map[string]bool
	lv     liveness
	// resolvedWas is each subscription's resolved-ts after the last
	// command (checkInvariants).
	resolvedWas map[*sub]common.Ts
}

func newTraceCore(t *testing.T, d *datadriven.TestData) *traceCore {
	from, rows := Position{}, 1<<20
	for _, a := range d.CmdArgs {
		switch a.Key {
		case "from":
			from = parsePos(t, a.Vals[0])
		case "chunk-rows":
			rows = atoi(t, a.Vals[0])
		}
	}
	w := &traceCore{c: newCore(newStreamState(map[uint32]pgcodec.Relation{}), from, rows), subs: map[uint32][]*sub{},
		names: map[uint32]string{}, chunks: map[string]*copyChunk{}, live: map[string]bool{},
		resolvedWas: map[*sub]common.Ts{}}
	return w
}

func (w *traceCore) run(t *testing.T, d *datadriven.TestData) (string, error) {
	c := w.c
	args := map[string]string{}
	var order []string
	for _, a := range d.CmdArgs {
		v := ""
		if len(a.Vals) > 0 {
			v = strings.Join(a.Vals, ",")
		}
		args[a.Key] = v
		order = append(order, a.Key)
	}
	oid := uint32(0)
	if v, ok := args["oid"]; ok {
		oid = uint32(atoi(t, v))
	}
	switch d.Cmd {
	case "known":
		rel := parseRel(t, oid, args["name"], args["cols"], args["identity"])
		c.st.known[oid] = rel
		w.names[oid] = args["name"]
	case "sub":
		b := &sub{oid: oid}
		if v, ok := args["start"]; ok {
			b.startTs = parseTs(t, v)
		}
		b.have, b.resolved = b.startTs, b.startTs
		if v, ok := args["have"]; ok {
			b.have, b.resolved = parseTs(t, v), parseTs(t, v)
		}
		if w.pend == nil {
			w.pend = map[uint32][]*sub{}
			for k, l := range w.subs {
				w.pend[k] = slices.Clone(l)
			}
		}
		w.pend[oid] = append(w.pend[oid], b)
	case "begin":
		var handed map[uint32][]*sub
		if w.pend != nil {
			handed, w.subs, w.pend = w.pend, w.pend, nil
		}
		return "", c.begin(msgBegin{commitTime: time.UnixMilli(int64(atoi(t, args["time"]))), xid: uint32(atoi(t, args["xid"]))}, handed)
	case "relation":
		rel := parseRel(t, oid, args["name"], args["cols"], args["identity"])
		w.names[oid] = args["name"]
		m := &msgRelation{oid: oid, namespace: "public", name: args["name"]}
		for _, col := range rel.Columns {
			m.columns = append(m.columns, relColumn{name: col.Name, key: col.Key})
		}
		c.relation(m, rel)
	case "insert", "update", "delete":
		rel := c.st.known[oid]
		tuple := func(vals map[string]string, unchanged string) []tupleCol {
			out := make([]tupleCol, len(rel.Columns))
			for i, col := range rel.Columns {
				v, ok := vals[col.Name]
				switch {
				case col.Name == unchanged:
					out[i] = tupleCol{kind: 'u'}
				case !ok || v == "null":
					out[i] = tupleCol{kind: 'n'}
				default:
					out[i] = tupleCol{kind: 't', data: []byte(v)}
				}
			}
			return out
		}
		vals := map[string]string{}
		for _, k := range order {
			if k != "oid" && k != "old" && k != "full" && k != "unchanged" {
				vals[k] = args[k]
			}
		}
		switch d.Cmd {
		case "insert":
			return "", c.change(oid, pgcodec.Insert, nil, 0, tuple(vals, ""))
		case "delete":
			kind := byte('K')
			if _, full := args["full"]; full {
				kind = 'O' // REPLICA IDENTITY FULL: the whole old row
			}
			return "", c.change(oid, pgcodec.Delete, tuple(vals, ""), kind, nil)
		default:
			var old []tupleCol
			kind := byte(0)
			if o, ok := args["old"]; ok {
				ov := map[string]string{}
				for _, kv := range strings.Split(o, ";") {
					k, v, _ := strings.Cut(kv, "=")
					ov[k] = v
				}
				kind = 'K'
				if _, full := args["full"]; full {
					kind = 'O'
				}
				old = tuple(ov, "")
			}
			return "", c.change(oid, pgcodec.Update, old, kind, tuple(vals, args["unchanged"]))
		}
	case "truncate":
		var m msgTruncate
		for _, v := range strings.Split(args["oids"], ",") {
			m.rels = append(m.rels, uint32(atoi(t, v)))
		}
		return "", c.truncate(m)
	case "commit":
		return "", c.commit(msgCommit{endLSN: uint64(atoi(t, args["lsn"]))})
	case "heartbeat":
		c.message(msgMessage{transactional: true, prefix: heartbeatPrefix}, nil, false)
	case "keepalive":
		c.keepalive(uint64(atoi(t, args["wal-end"])))
	case "tick":
		c.resolve(c.resolveTarget(), w.allSubs())
	case "confirm":
		saved := c.journal[0]
		if v, ok := args["saved"]; ok {
			saved = parsePos(t, v)
		}
		var holds []common.Ts
		if v, ok := args["holds"]; ok {
			for _, h := range strings.Split(v, ",") {
				holds = append(holds, parseTs(t, h))
			}
		}
		safe, known := common.Ts(0), args["safe"] != "unknown"
		if known {
			safe = parseTs(t, args["safe"])
		}
		return "confirm " + fmtPos(nextConfirm(saved, c.journal, c.walEnd, safe, known, holds)) + "\n", nil
	case "confirmed":
		c.confirmed(Position{LSN: uint64(atoi(t, args["lsn"]))})
	case "chunk":
		ch := &copyChunk{id: args["id"], st: &copyState{oid: oid, refetch: map[string][][]byte{}}, done: make(chan struct{})}
		if prev, ok := w.chunks[args["prev"]]; ok {
			ch.st = prev.st // a later chunk of the same copy
		}
		_, ch.first = args["first"]
		_, ch.keyless = args["keyless"]
		if v, ok := args["xmin"]; ok {
			ch.sees.xmin = uint32(atoi(t, v))
		}
		if v, ok := args["xmax"]; ok {
			ch.sees.xmax = uint32(atoi(t, v))
		}
		_, ch.st.fresh = args["fresh"]
		_, ch.final = args["final"]
		_, ch.last = args["last"]
		ch.rel = c.st.known[oid]
		if v, ok := args["rows"]; ok && v != "" {
			for _, kv := range strings.Split(v, ",") {
				k, val, _ := strings.Cut(kv, ":")
				r := copiedRow{key: [][]byte{[]byte(k)}, datums: []pgcodec.Datum{
					{Name: ch.rel.Columns[0].Name, Kind: pgcodec.Text, Text: []byte(k)}, {Name: ch.rel.Columns[1].Name, Kind: pgcodec.Text, Text: []byte(val)}}}
				if ch.keyless {
					r.key = nil
				}
				ch.rows = append(ch.rows, r)
			}
		}
		if v, ok := args["xip"]; ok {
			for _, x := range strings.Split(v, ",") {
				ch.sees.xip = append(ch.sees.xip, uint32(atoi(t, x)))
			}
		}
		_, notReady := args["not-ready"]
		ch.ready = !notReady
		w.chunks[ch.id] = ch
		w.live[ch.id] = true
	case "low", "high":
		ch := w.chunks[args["id"]]
		if !w.live[args["id"]] {
			ch = nil // given up: the shell finds no chunk registered
		}
		ready := ch != nil && ch.ready
		c.message(msgMessage{transactional: true, prefix: copyPrefix, content: []byte(d.Cmd + ":" + args["id"])}, ch, ready)
	case "given-up":
		w.live[args["id"]] = false
		c.forgetCopies(func(ch *copyChunk) bool { return w.live[ch.id] }, func(*copyState) bool { return false })
	case "reseed":
		var saved Position
		v, found := args["saved"]
		if found {
			saved = parsePos(t, v)
		}
		all := w.allSubs()
		if w.pend != nil { // subscribed before the session starts
			all = nil
			for _, l := range w.pend {
				all = append(all, l...)
			}
		}
		p, err := reseedFrom(c.journal[0], uint64(atoi(t, args["confirmed"])), saved, found, all)
		if err != nil {
			return "", err
		}
		c.last, c.journal = p.Ts, []Position{p} // the session's core starts from p
		return "reseed " + fmtPos(p) + "\n", nil
	case "live":
		w.lv = newLiveness(parseDur(t, args["timeout"]))
	case "live-step":
		_, heard := args["heard"]
		v := w.lv.step(parseDur(t, args["elapsed"]), heard)
		var out []string
		if v.ask {
			out = append(out, "ask")
		}
		if v.silent {
			out = append(out, fmt.Sprintf("silent quiet=%v since-ask=%v", v.quiet, v.sinceAsk))
		}
		if v.heardPastTimeout {
			out = append(out, "heard-past-timeout")
		}
		out = append(out, fmt.Sprintf("wake-in=%v", v.wakeIn))
		return strings.Join(out, " ") + "\n", nil
	default:
		t.Fatalf("%s: unknown command %q", d.Pos, d.Cmd)
	}
	return "", nil
}

// allSubs lists the subscriptions handed over, by table.
// allSubs is every subscription, those not handed over yet included (a
// tick reads the live list, as the shell's Source.allSubs does).
func (w *traceCore) allSubs() []*sub {
	var out []*sub
	for _, oid := range w.oids() {
		out = append(out, w.liveSubs()[oid]...)
	}
	return out
}

// liveSubs is the subscriptions by table, those not handed over yet included.
func (w *traceCore) liveSubs() map[uint32][]*sub {
	if w.pend != nil {
		return w.pend
	}
	return w.subs
}

func (w *traceCore) oids() []uint32 {
	var oids []uint32
	for oid := range w.liveSubs() {
		oids = append(oids, oid)
	}
	slices.Sort(oids)
	return oids
}

func (w *traceCore) name(oid uint32) string {
	if n := w.names[oid]; n != "" {
		return n
	}
	return fmt.Sprintf("t%d", oid)
}

// fmtAction prints an action as the shell would carry it out.
func (w *traceCore) fmtAction(a action) string {
	switch a.kind {
	case actPush:
		var rows []string
		for _, r := range a.batch.Rows {
			rc, err := pgcodec.DecodeValue(r.Value)
			if err != nil {
				rows = append(rows, "undecodable:"+err.Error())
				continue
			}
			s := rc.Change.String()
			if cols := fmtDatums(rc.Columns); cols != "" {
				s += "(" + cols + ")"
			}
			if rc.From != nil && rc.Change == pgcodec.Update {
				s += "<-(" + fmtDatums(rc.From) + ")" // a keyless table's old row
			}
			rows = append(rows, s+"@"+fmtTs(r.CommitTs))
		}
		out := "push " + w.name(a.sub.oid)
		if len(rows) > 0 {
			out += " rows=[" + strings.Join(rows, " ") + "]"
		}
		if a.batch.ResolvedTs != 0 {
			out += " resolved=" + fmtTs(a.batch.ResolvedTs)
		}
		return out
	case actResolve:
		var names []string
		for _, b := range a.subs {
			names = append(names, w.name(b.oid))
		}
		return fmt.Sprintf("resolve %s to %s", strings.Join(names, ","), fmtTs(a.ts))
	case actDDL:
		out := fmt.Sprintf("ddl %s@%s", w.name(uint32(a.ddl.TableID)), fmtTs(a.ddl.CommitTs))
		if rel, err := pgcodec.ParseRelationDDL(a.ddl.Query); err == nil {
			return out + " cols=" + fmtCols(rel)
		}
		return out + " (a version without a key)"
	case actAnnounce:
		s := fmt.Sprintf("announce %s from %s", w.name(a.rel.OID), fmtTs(a.ts))
		if a.err != nil {
			s += " (cannot be replicated)"
		}
		return s
	case actFinishCopy:
		s := fmt.Sprintf("finish-copy %s at %s", a.chunk.id, fmtTs(a.ts))
		if a.retry {
			s += " retry"
		} else {
			s += fmt.Sprintf(" pushed=%d", a.chunk.pushed)
			if a.chunk.ended {
				s += " ended"
			}
		}
		return s
	default:
		return a.kind.String() + " " + fmtTs(a.ts)
	}
}

// dump prints the core's state.
func (w *traceCore) dump() string {
	c := w.c
	var b strings.Builder
	fmt.Fprintf(&b, "> last=%s", fmtTs(c.last))
	if c.cur != nil {
		fmt.Fprintf(&b, " txn=%s", fmtTs(c.cur.ts))
	}
	var j []string
	for _, p := range c.journal {
		j = append(j, fmtPos(p))
	}
	fmt.Fprintf(&b, " journal=[%s]", strings.Join(j, " "))
	if c.walEnd.LSN != 0 {
		fmt.Fprintf(&b, " wal-end=%s", fmtPos(c.walEnd))
	}
	b.WriteString("\n")
	for _, oid := range w.oids() {
		for _, s := range w.liveSubs()[oid] {
			fmt.Fprintf(&b, "> %s have=%s resolved=%s", w.name(oid), fmtTs(s.have), fmtTs(s.resolved))
			if s.partial != 0 {
				fmt.Fprintf(&b, " partial=%s", fmtTs(s.partial))
			}
			if s.missed {
				b.WriteString(" missed")
			}
			b.WriteString("\n")
		}
	}
	var ws []string
	for oid, l := range c.st.copyWindows {
		for _, ch := range l {
			ws = append(ws, fmt.Sprintf("%s:%s(%d touched)", w.name(oid), ch.id, len(ch.window)))
		}
	}
	if len(ws) > 0 {
		slices.Sort(ws)
		fmt.Fprintf(&b, "> windows %s\n", strings.Join(ws, " "))
	}
	return b.String()
}

// checkInvariants checks what the core promises after every input.
func (w *traceCore) checkInvariants(t *testing.T) {
	c := w.c
	for _, l := range w.liveSubs() {
		for _, s := range l {
			// What the core moved in this command (a session reading the
			// slot again starts below what its subscriptions have).
			if prev, ok := w.resolvedWas[s]; !ok {
				w.resolvedWas[s] = s.resolved // as the script made it
			} else if prev != s.resolved {
				if s.resolved > c.last && (c.cur == nil || s.resolved != c.cur.ts) {
					t.Fatalf("%s resolved to %s past the last commit %s", w.name(s.oid), fmtTs(s.resolved), fmtTs(c.last))
				}
				if s.missed {
					t.Fatalf("%s resolved to %s after it missed a commit", w.name(s.oid), fmtTs(s.resolved))
				}
				w.resolvedWas[s] = s.resolved
			}
			if s.partial != 0 && s.resolved >= s.partial {
				t.Fatalf("%s resolved to %s past a commit %s it was pushed part of", w.name(s.oid), fmtTs(s.resolved), fmtTs(s.partial))
			}
		}
	}
	for i := 1; i < len(c.journal); i++ {
		if c.journal[i].LSN <= c.journal[i-1].LSN || c.journal[i].Ts <= c.journal[i-1].Ts {
			t.Fatalf("the journal is not in order: %v", c.journal)
		}
	}
}

func fmtTs(ts common.Ts) string {
	return fmt.Sprintf("%d.%d", ts.PhysicalMs(), uint64(ts)&common.MaxLogical)
}

func fmtPos(p Position) string { return fmt.Sprintf("%d/%s", p.LSN, fmtTs(p.Ts)) }

func fmtCols(rel pgcodec.Relation) string {
	var cols []string
	for _, col := range rel.Columns {
		s := col.Name
		if col.Key {
			s += ":key"
		}
		cols = append(cols, s)
	}
	return strings.Join(cols, ",")
}

func parseTs(t *testing.T, v string) common.Ts {
	ms, l, _ := strings.Cut(v, ".")
	logical := 0
	if l != "" {
		logical = atoi(t, l)
	}
	return common.ComposeTs(int64(atoi(t, ms)), int64(logical))
}

func parsePos(t *testing.T, v string) Position {
	lsn, ts, _ := strings.Cut(v, "/")
	return Position{LSN: uint64(atoi(t, lsn)), Ts: parseTs(t, ts)}
}

func parseRel(t *testing.T, oid uint32, name, cols, identity string) pgcodec.Relation {
	rel := pgcodec.Relation{OID: oid, Schema: "public", Name: name, Identity: identity}
	for _, c := range strings.Split(cols, ",") {
		n, key := strings.CutSuffix(c, ":key")
		rel.Columns = append(rel.Columns, pgcodec.Column{Name: n, Type: "text", Key: key})
	}
	require.NoError(t, rel.Validate())
	return rel
}

func fmtDatums(ds []pgcodec.Datum) string {
	var cols []string
	for _, d := range ds {
		switch d.Kind {
		case pgcodec.Null:
			cols = append(cols, d.Name+"=null")
		case pgcodec.Unchanged:
			cols = append(cols, d.Name+"=<unchanged>")
		default:
			cols = append(cols, d.Name+"="+string(d.Text))
		}
	}
	return strings.Join(cols, " ")
}

func parseDur(t *testing.T, v string) time.Duration {
	d, err := time.ParseDuration(v)
	require.NoError(t, err)
	return d
}

func atoi(t *testing.T, v string) int {
	n, err := strconv.Atoi(v)
	require.NoError(t, err, v)
	return n
}

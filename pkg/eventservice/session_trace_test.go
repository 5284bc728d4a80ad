package eventservice

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

// TestSessionTraceWithScriptedStoreAndTransport drives a whole service,
// never started, from the scripts in testdata/session: the test goroutine
// plays every worker in turn (one iteration per command), so each
// interleaving is written down, and the output shows each owner step's
// input and effects, each transition, each message on the wire and, after
// every command, where each session stands. The service, its queues, its
// core and its workers' bodies are the real ones; the store and the
// transport are scripted fakes (the edges the scripts are about), the
// schema store the in-memory one, the clock a fake.
//
// Commands (dispatcher dN is on table N, target t1):
//
//	options k=v...                 first, if at all: scan-limit-rows, batch-rows,
//	                               scan-limit-bytes, large-txn-split-bytes
//	register dN start=T            Register
//	rows dN key@commit[/start]...  rows the store holds for dN
//	notify dN resolved=T [max=M]   the store's notification
//	schema T                       the schema frontier moves to T
//	ddl dN at=T                    a DDL of dN's table at T
//	pop-prepare [batch [hold=N]]   a preparation worker's iteration (batch: as the
//	                               running worker does, prepareBatch over up to
//	                               prepareBatchMax sessions, with hold what it
//	                               holds over to the next iteration (prepareBatchHolding);
//	                               otherwise one session)
//	pop-scan                       a scan worker's iteration
//	schema-retry                   the schema-retry loop's round
//	backoff-expire                 the clock passes BackoffMax; due back-offs fire
//	room                           the target has room again (the room watcher's round)
//	pump                           the resolved-set pump's delivery
//	keepalive                      the clock passes SignalInterval; a keepalive round
//	transport ok|busy|fail         how the transport answers from now on
//	heartbeat dN epoch=E ts=T      the collector's checkpoint
//	reset dN epoch=E start=T       Reset
//	remove dN                      Remove
//	on-step dN <input> <command>   run command (notify, remove, reset, schema: as above,
//	                               without its dispatcher) when dN's owner next steps
//	                               on input (prepare, handshake_sent, scan_read,
//	                               scan_sent), before the step's effects are carried out
//
// Regenerate with `go test -run TestSessionTrace -rewrite` and read the diff.
func TestSessionTraceWithScriptedStoreAndTransport(t *testing.T) {
	datadriven.Walk(t, "testdata/session", func(t *testing.T, path string) {
		w := newTraceWorld(t)
		defer w.close()
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			return w.run(t, d)
		})
	})
}

// traceWorld is the service of one script and its scripted edges.
type traceWorld struct {
	t *testing.T
	// keepalives is the keepalive counter at the last round's end.
	keepalives float64
	clk        *clock.Fake
	store      *scriptedStoreForTrace
	tr         *scriptedTransportForTrace
	schema     *schemastore.Memory
	svc        *Service
	// out collects the lines of the command in progress; mu guards it
	// (a preparation worker waiting for the scan channel prints from its
	// goroutine, in an order the command fixes).
	mu   sync.Mutex
	out  strings.Builder
	regs map[common.DispatcherID]messaging.RegistrationID
	// onStep are commands to run inside the next matching step, in order.
	onStep []*stepCommand
	// waiting is a preparation worker held by a full scan channel: done is
	// closed when its iteration ends.
	waiting chan struct{}
	prepare *ownerWork
	scan    *ownerWork
}

const traceTarget messaging.Target = "t1"

func newTraceWorld(t *testing.T) *traceWorld {
	w := &traceWorld{t: t, clk: clock.NewFake(time.Unix(1000, 0)), regs: map[common.DispatcherID]messaging.RegistrationID{}}
	w.store = &scriptedStoreForTrace{w: w, rows: map[common.DispatcherID][]common.Row{}, notifiers: map[common.DispatcherID]eventstore.Notifier{}}
	w.tr = &scriptedTransportForTrace{w: w}
	var err error
	w.schema, err = schemastore.NewMemory(schemastore.MemoryOptions{InitialResolvedTs: 1})
	require.NoError(t, err)
	w.build(nil)
	return w
}

// build makes the world's service, with tweak applied to its options.
func (w *traceWorld) build(tweak func(*Options)) {
	t := w.t
	opts := Options{Store: w.store, Schema: w.schema, Transport: w.tr, Clock: w.clk,
		PrepareWorkers: 1, ScanWorkers: 1, ScanQueueSize: 1, BatchRows: 2,
		BackoffBase: 10 * time.Millisecond, BackoffMax: 40 * time.Millisecond, SignalInterval: time.Second,
		Logger: zap.NewNop()}
	if tweak != nil {
		tweak(&opts)
	}
	var err error
	w.svc, err = New(opts)
	require.NoError(t, err)
	w.prepare, w.scan = &ownerWork{}, &ownerWork{sc: newScanner(w.svc)}
	w.svc.knobs = testingKnobs{
		stepped: func(s *session, in input, fx []effect) {
			w.printf("  %s step %s\n", name(s), in)
			for _, e := range fx {
				w.printf("    %s\n", e)
			}
			rest := w.onStep[:0]
			for _, c := range w.onStep {
				if c.id != s.d.id || c.input != in.kind {
					rest = append(rest, c)
					continue
				}
				w.printf("  (while %s is owned) %s\n", name(s), c.text)
				w.exec(t, c.cmd, c.id, c.args)
			}
			w.onStep = rest
		},
		ended: func(s *session, e effect) {
			st, pending := s.sched.load()
			w.printf("  %s %s -> %s%s\n", name(s), e.ev, st, pendingMark(pending))
		},
		keepaliveRound: func(examined int) {
			total := testutilCounter(w.svc.metrics.keepalives)
			w.printf("  keepalive round: examined %d, re-sent %v\n", examined, total-w.keepalives)
			w.keepalives = total
		},
		at: func(p point, s *session, _ *dispatcher) {
			if p == pointScanChannelFull {
				w.printf("  %s scan channel full: the preparation worker waits\n", name(s))
			}
		},
	}
}

func (w *traceWorld) close() {
	if w.waiting != nil {
		<-w.waiting
	}
	require.NoError(w.t, w.svc.Close())
}

func (w *traceWorld) printf(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	fmt.Fprintf(&w.out, format, args...)
}

func name(s *session) string { return fmt.Sprintf("d%d/e%d", s.d.id.Lo, s.epoch) }

func pendingMark(p bool) string {
	if p {
		return " +pending"
	}
	return ""
}

func (w *traceWorld) run(t *testing.T, d *datadriven.TestData) string {
	ctx := context.Background()
	svc := w.svc
	arg := func(key string) uint64 {
		var v uint64
		d.ScanArgs(t, key, &v)
		return v
	}
	id := func() common.DispatcherID {
		if len(d.CmdArgs) == 0 {
			d.Fatalf(t, "%s: which dispatcher?", d.Cmd)
		}
		n, err := strconv.ParseUint(strings.TrimPrefix(d.CmdArgs[0].Key, "d"), 10, 64)
		if err != nil {
			d.Fatalf(t, "%s: dispatcher %q", d.Cmd, d.CmdArgs[0].Key)
		}
		return common.DispatcherIDFromUint64(n)
	}
	report := func(err error) {
		if err != nil {
			w.printf("  error: %v\n", err)
		}
	}
	switch d.Cmd {
	case "options":
		// Before anything else: the service is made again with these.
		if len(w.regs) > 0 {
			d.Fatalf(t, "options must come before the first register")
		}
		require.NoError(t, w.svc.Close())
		args := traceArgs(t, d, d.CmdArgs)
		w.build(func(o *Options) {
			for k, v := range args {
				switch k {
				case "scan-limit-rows":
					o.ScanLimitRows = int(v)
				case "batch-rows":
					o.BatchRows = int(v)
				case "scan-limit-bytes":
					o.ScanLimitBytes = int(v)
				case "large-txn-split-bytes":
					o.LargeTxnSplitBytes = int(v)
				case "resolved-batch":
					o.ResolvedBatch = int(v)
				default:
					d.Fatalf(t, "options: unknown %q", k)
				}
			}
		})
	case "register":
		did := id()
		reg := messaging.RegistrationID(len(w.regs) + 1)
		w.regs[did] = reg
		report(svc.Register(ctx, messaging.RegisterRequest{Dispatcher: did, Registration: reg,
			Span: common.TableSpan(int64(did.Lo)), StartTs: common.Ts(arg("start")), Target: traceTarget}))
	case "rows":
		did := id()
		for _, a := range d.CmdArgs[1:] {
			w.store.add(did, parseTraceRow(t, d, a.Key))
		}
	case "notify", "remove", "reset", "heartbeat", "schema":
		var did common.DispatcherID
		if d.Cmd != "schema" {
			did = id()
		}
		w.exec(t, d.Cmd, did, traceArgs(t, d, d.CmdArgs))
	case "ddl":
		did := id()
		require.NoError(t, w.schema.AddDDL(schemastore.DDL{TableID: int64(did.Lo), CommitTs: common.Ts(arg("at")), Query: "ALTER"}))
	case "pop-prepare":
		hold := 0
		if d.HasArg("hold") {
			d.ScanArgs(t, "hold", &hold)
		}
		w.popPrepare(t, d, d.HasArg("batch"), hold)
	case "pop-scan":
		w.popScan()
	case "schema-retry":
		svc.retryBlocked(nil)
	case "backoff-expire":
		w.clk.Advance(svc.opts.BackoffMax)
		svc.backoff.fireDue(w.clk.Now(), svc.backoffExpired)
	case "room":
		tg := w.target(t, d)
		tg.room.wake(tg)
	case "pump":
		tg := w.target(t, d)
		batch := tg.resolved.Drain(svc.opts.ResolvedBatch, nil)
		err := tg.deliver(ctx, batch)
		report(tg.resolved.Complete(batch, err))
	case "keepalive":
		w.clk.Advance(svc.opts.SignalInterval)
		svc.keepaliveRound(nil)
	case "transport":
		w.tr.mode = d.CmdArgs[0].Key
	case "on-step":
		if len(d.CmdArgs) < 3 {
			d.Fatalf(t, "on-step dN <input> <command> [args]")
		}
		c := &stepCommand{id: id(), cmd: d.CmdArgs[2].Key, args: traceArgs(t, d, d.CmdArgs[3:])}
		words := []string{c.cmd}
		for _, a := range d.CmdArgs[3:] {
			words = append(words, a.String())
		}
		c.text = strings.Join(words, " ")
		kind := slices.Index(inputNames[:], d.CmdArgs[1].Key)
		if kind < 0 {
			d.Fatalf(t, "on-step: unknown input %q", d.CmdArgs[1].Key)
		}
		c.input = inputKind(kind)
		w.onStep = append(w.onStep, c)
	default:
		d.Fatalf(t, "unknown command %q", d.Cmd)
	}
	w.printState()
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.out.String()
	w.out.Reset()
	return out
}

// stepCommand is an on-step command.
type stepCommand struct {
	id    common.DispatcherID
	input inputKind
	cmd   string
	args  map[string]uint64
	text  string // as the script wrote it
}

// traceArgs reads key=value arguments as numbers (the first, the
// dispatcher, and bare keys are skipped; schema's bare value is "ts").
func traceArgs(t *testing.T, d *datadriven.TestData, args []datadriven.CmdArg) map[string]uint64 {
	m := map[string]uint64{}
	for _, a := range args {
		if len(a.Vals) == 0 {
			if v, err := strconv.ParseUint(a.Key, 10, 64); err == nil {
				m["ts"] = v
			}
			continue
		}
		v, err := strconv.ParseUint(a.Vals[0], 10, 64)
		if err != nil {
			d.Fatalf(t, "%s=%q: want a number", a.Key, a.Vals[0])
		}
		m[a.Key] = v
	}
	return m
}

// exec runs one of the commands that may also run inside a step.
func (w *traceWorld) exec(t *testing.T, cmd string, id common.DispatcherID, args map[string]uint64) {
	ctx, svc := context.Background(), w.svc
	report := func(err error) {
		if err != nil {
			w.printf("  error: %v\n", err)
		}
	}
	switch cmd {
	case "notify":
		w.store.notify(id, common.Ts(args["resolved"]), common.Ts(args["max"]))
	case "schema":
		require.NoError(t, w.schema.AdvanceResolvedTs(common.Ts(args["ts"])))
	case "heartbeat":
		reply, err := svc.Heartbeat(ctx, messaging.HeartbeatRequest{Checkpoints: []messaging.DispatcherCheckpoint{{Dispatcher: id,
			Registration: w.regs[id], Epoch: args["epoch"], Ts: common.Ts(args["ts"])}}})
		report(err)
		if err == nil && reply.Codes[0] != messaging.CodeOK {
			w.printf("  heartbeat: %v\n", reply.Codes[0])
		}
	case "reset":
		report(svc.Reset(ctx, messaging.ResetRequest{Dispatcher: id, Registration: w.regs[id], Epoch: args["epoch"],
			StartTs: common.Ts(args["start"])}))
	case "remove":
		report(svc.Remove(ctx, messaging.RemoveRequest{Dispatcher: id, Registration: w.regs[id]}))
	default:
		t.Fatalf("command %q cannot run here", cmd)
	}
}

// popPrepare runs one preparation worker iteration. One that finds the
// scan channel full waits for it on its own goroutine (as a real worker
// does) until a pop-scan makes room.
func (w *traceWorld) popPrepare(t *testing.T, d *datadriven.TestData, batch bool, hold int) {
	if w.waiting != nil {
		d.Fatalf(t, "the preparation worker is still waiting for the scan channel")
	}
	q := w.svc.prepQueues[0]
	done, full := make(chan struct{}), make(chan struct{}, 1)
	at := w.svc.knobs.at
	w.svc.knobs.at = func(p point, s *session, dd *dispatcher) {
		at(p, s, dd)
		if p == pointScanChannelFull {
			full <- struct{}{}
		}
	}
	go func() {
		defer close(done)
		if batch {
			if n, _ := w.svc.prepareBatchHolding(w.prepare, q, hold); n == 0 {
				w.printf("  nothing to prepare\n")
			}
			return
		}
		if popped, _ := w.svc.prepareNext(w.prepare, q); !popped {
			w.printf("  nothing to prepare\n")
		}
	}()
	select {
	case <-done:
	case <-full:
		w.waiting = done
	}
	w.svc.knobs.at = at
}

// popScan runs one scan worker iteration on the session at the head of
// the scan channel. A preparation worker waiting for room enters the
// channel first and finishes its iteration before the scan runs, so the
// trace's order is fixed.
func (w *traceWorld) popScan() {
	select {
	case s := <-w.svc.scanCh:
		if w.waiting != nil {
			<-w.waiting
			w.waiting = nil
		}
		w.svc.scanOne(w.scan, s)
	default:
		w.printf("  nothing to scan\n")
	}
}

func (w *traceWorld) target(t *testing.T, d *datadriven.TestData) *target {
	w.svc.mu.RLock()
	defer w.svc.mu.RUnlock()
	tg := w.svc.mu.targets[traceTarget]
	if tg == nil {
		d.Fatalf(t, "%s: no target", d.Cmd)
	}
	return tg
}

// printState prints each registered dispatcher's current session and what
// holds sessions: the queues, the parking sets, the resolved set.
func (w *traceWorld) printState() {
	svc := w.svc
	svc.mu.RLock()
	ds := make([]*dispatcher, 0, svc.mu.dispatchers.Len())
	for d := range svc.mu.dispatchers.All() {
		ds = append(ds, d)
	}
	tg := svc.mu.targets[traceTarget]
	svc.mu.RUnlock()
	slices.SortFunc(ds, func(a, b *dispatcher) int { return cmp.Compare(a.id.Lo, b.id.Lo) })
	w.printf("state:")
	for _, d := range ds {
		s := d.session.Load()
		st, pending := s.sched.load()
		p := s.own.progress
		w.printf(" %s %s%s resolved=%d seq=%d;", name(s), st, pendingMark(pending), p.resolved, p.seq)
	}
	w.printf(" prepare-queue=%d scan-channel=%d blocked=%d backoff=%d", svc.prepQueues[0].len(), len(svc.scanCh), svc.blocked.len(), svc.backoff.len())
	if tg != nil {
		tg.room.mu.Lock()
		waiting := len(tg.room.mu.waiting)
		tg.room.mu.Unlock()
		w.printf(" room-waiters=%d resolved-set=%d", waiting, tg.resolved.Len())
	}
	w.printf("\n")
}

// parseTraceRow reads key@commit[/start] (start defaults to commit-1).
func parseTraceRow(t *testing.T, d *datadriven.TestData, spec string) common.Row {
	key, ts, ok := strings.Cut(spec, "@")
	if !ok {
		d.Fatalf(t, "row %q: want key@commit[/start]", spec)
	}
	commitS, startS, hasStart := strings.Cut(ts, "/")
	commit, err := strconv.ParseUint(commitS, 10, 64)
	require.NoError(t, err)
	start := commit - 1
	if hasStart {
		start, err = strconv.ParseUint(startS, 10, 64)
		require.NoError(t, err)
	}
	return common.Row{Op: common.OpPut, Key: []byte(key), Value: []byte("v"), StartTs: common.Ts(start), CommitTs: common.Ts(commit)}
}

// scriptedStoreForTrace is the event store of a trace: rows the script
// wrote, notifications the script sends.
type scriptedStoreForTrace struct {
	w         *traceWorld
	mu        sync.Mutex
	rows      map[common.DispatcherID][]common.Row
	notifiers map[common.DispatcherID]eventstore.Notifier
}

func (st *scriptedStoreForTrace) add(id common.DispatcherID, r common.Row) {
	st.mu.Lock()
	defer st.mu.Unlock()
	rows := append(st.rows[id], r)
	slices.SortStableFunc(rows, compareRowPosition)
	st.rows[id] = rows
}

func compareRowPosition(a, b common.Row) int {
	return cmp.Or(cmp.Compare(a.CommitTs, b.CommitTs), cmp.Compare(a.StartTs, b.StartTs), bytes.Compare(a.Key, b.Key))
}

func (st *scriptedStoreForTrace) notify(id common.DispatcherID, resolved, maxCommit common.Ts) {
	st.mu.Lock()
	n := st.notifiers[id]
	st.mu.Unlock()
	if n != nil {
		n.Notify(resolved, maxCommit)
	}
}

func (st *scriptedStoreForTrace) RegisterDispatcher(id common.DispatcherID, _ common.Span, startTs common.Ts, n eventstore.Notifier) error {
	st.w.printf("  store: register d%d from %d\n", id.Lo, startTs)
	st.mu.Lock()
	defer st.mu.Unlock()
	st.notifiers[id] = n
	return nil
}

func (st *scriptedStoreForTrace) UnregisterDispatcher(id common.DispatcherID) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.notifiers[id] == nil {
		return eventstore.ErrDispatcherNotFound
	}
	st.w.printf("  store: unregister d%d\n", id.Lo)
	delete(st.notifiers, id)
	return nil
}

func (st *scriptedStoreForTrace) UpdateCheckpoint(id common.DispatcherID, ts common.Ts) error {
	st.w.printf("  store: checkpoint d%d at %d\n", id.Lo, ts)
	return nil
}

func (st *scriptedStoreForTrace) NewIterator(id common.DispatcherID, r eventstore.ScanRange) (eventstore.RowIterator, error) {
	st.mu.Lock()
	defer st.mu.Unlock()
	var rows []common.Row
	for _, row := range st.rows[id] {
		if row.CommitTs <= r.Start || row.CommitTs > r.End {
			continue
		}
		if a := r.After; a != nil {
			c := cmp.Or(cmp.Compare(row.CommitTs, a.CommitTs), cmp.Compare(row.StartTs, a.StartTs))
			if c < 0 || c == 0 && (a.Key == nil || bytes.Compare(row.Key, a.Key) <= 0) {
				continue
			}
		}
		rows = append(rows, row)
	}
	return &sliceIteratorForTrace{rows: rows, i: -1}, nil
}

type sliceIteratorForTrace struct {
	rows []common.Row
	i    int
}

func (it *sliceIteratorForTrace) Next() bool       { it.i++; return it.i < len(it.rows) }
func (it *sliceIteratorForTrace) Row() *common.Row { return &it.rows[it.i] }
func (it *sliceIteratorForTrace) Err() error       { return nil }
func (it *sliceIteratorForTrace) Close() error     { return nil }
func (it *sliceIteratorForTrace) NewTxn() bool {
	if it.i == 0 {
		return true
	}
	a, b := it.rows[it.i-1], it.rows[it.i]
	return a.CommitTs != b.CommitTs || a.StartTs != b.StartTs
}

// scriptedTransportForTrace answers as the script says and prints what it
// accepted. It can signal room again (the room command plays its signal).
// Modes: ok (or ""), busy (refuses as busy yet reports room, as a target
// whose last credit is less than the send needs does), full (refuses and
// reports no room), fail.
type scriptedTransportForTrace struct {
	w    *traceWorld
	mode string
}

var closedRoomForTrace = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

func (tr *scriptedTransportForTrace) Room(messaging.Target) <-chan struct{} {
	return closedRoomForTrace
}

func (tr *scriptedTransportForTrace) HasRoom(messaging.Target) bool { return tr.mode != "full" }

func (tr *scriptedTransportForTrace) Send(_ messaging.Target, msgs []messaging.Message) error {
	switch tr.mode {
	case "busy", "full":
		tr.w.printf("  wire: refused (busy) %d messages\n", len(msgs))
		return fmt.Errorf("%w: scripted", messaging.ErrBusy)
	case "fail":
		tr.w.printf("  wire: failed %d messages\n", len(msgs))
		return fmt.Errorf("%w: scripted", messaging.ErrUnavailable)
	}
	for _, m := range msgs {
		tr.w.printf("  wire: %s\n", describeForTrace(m))
	}
	return nil
}

func describeForTrace(m messaging.Message) string {
	hd := func(h messaging.Header) string { return fmt.Sprintf("d%d/e%d #%d", h.Dispatcher.Lo, h.Epoch, h.Seq) }
	switch m := m.(type) {
	case *messaging.Handshake:
		return fmt.Sprintf("handshake %s start=%d", hd(m.Header), m.StartTs)
	case *messaging.DMLBatch:
		keys := make([]string, len(m.Rows))
		for i, r := range m.Rows {
			keys[i] = fmt.Sprintf("%s@%d", r.Key, r.CommitTs)
		}
		s := fmt.Sprintf("dml %s [%s]", hd(m.Header), strings.Join(keys, " "))
		if m.Partial {
			s += " partial"
		}
		return s
	case *messaging.DDL:
		return fmt.Sprintf("ddl %s at=%d", hd(m.Header), m.CommitTs)
	case *messaging.Resolved:
		return fmt.Sprintf("resolved %s ts=%d", hd(m.Header), m.Ts)
	case *messaging.ResolvedBatch:
		entries := make([]string, len(m.Entries))
		for i := range m.Entries {
			e := &m.Entries[i]
			entries[i] = fmt.Sprintf("%s ts=%d", hd(e.Header), e.Ts)
		}
		return fmt.Sprintf("resolved_batch [%s]", strings.Join(entries, ", "))
	}
	return fmt.Sprintf("%T", m)
}

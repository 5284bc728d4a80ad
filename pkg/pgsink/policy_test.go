package pgsink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
)

// TestPolicyTrace drives a lane's flush policy (policy.go) from the
// scripts in testdata/policy, as the eventservice's traces drive its
// core: each command is a step of the lane goroutine, at a time the script
// sets, and prints what is due after it. `go test -run PolicyTrace
// -rewrite` regenerates the expected output after a deliberate change
// (read the diff: it is the change in behaviour).
//
//	policy [flush=D] [maxflush=D] [ckpt=D] [batch=N] [failures=N] [lanebytes=N]
//	                      a lane started at +0s (defaults: 100ms, 1s, 1s,
//	                      5000, 5; lanebytes, the lane's share of
//	                      QueueBytes: none, no commit due by bytes)
//	tick D                the clock moves on by D
//	take                  the lane takes the queued calls listed below,
//	  <d> rows=N [behind=D] [bytes=B]   N rows committed D before now, of B bytes
//	  <d> ckpt=TS             a checkpoint
//	  <d> ddl                 a DDL
//	  <d> begin=EPOCH         a new epoch
//	round [draining] [fail=<d>,...] [stop=<d>,...] [lost] [superseded]
//	                      the lane goroutine at now: commit what is due, if
//	                      anything; the commit succeeds, or the target
//	                      refuses it for the tables listed (fail: their
//	                      own fault; stop: a schema change) and the lane
//	                      commits them one by one, or the connection is
//	                      lost, or the fence refuses (superseded)
//
// After each command: the time, the rows pending, the next deadline (when
// the lane's wait ends with nothing queued), whether a warm-up may start,
// what a commit now would take (due), and each dispatcher held, its work
// in order.
func TestPolicyTrace(t *testing.T) {
	datadriven.Walk(t, "testdata/policy", func(t *testing.T, path string) {
		var w *policyTrace
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd == "policy" {
				w = newPolicyTrace(t, d)
				return w.dump()
			}
			require.NotNil(t, w, "%s: the script must start with policy", d.Pos)
			return w.run(t, d) + w.dump()
		})
	})
}

var policyT0 = time.Unix(1_800_000_000, 0)

type policyTrace struct {
	p   policy
	now time.Time
	ds  map[string]*dstate
}

func newPolicyTrace(t *testing.T, d *datadriven.TestData) *policyTrace {
	o := Options{FlushInterval: 100 * time.Millisecond, MaxFlushInterval: time.Second, CheckpointInterval: time.Second,
		BatchRows: 5000, MaxFailures: 5, Workers: 1}
	for _, a := range d.CmdArgs {
		switch a.Key {
		case "flush":
			o.FlushInterval = traceDuration(t, d, a.SingleVal(t))
		case "maxflush":
			o.MaxFlushInterval = traceDuration(t, d, a.SingleVal(t))
		case "ckpt":
			o.CheckpointInterval = traceDuration(t, d, a.SingleVal(t))
		case "batch":
			o.BatchRows = traceInt(t, d, a.SingleVal(t))
		case "failures":
			o.MaxFailures = traceInt(t, d, a.SingleVal(t))
		case "lanebytes":
			o.QueueBytes = int64(traceInt(t, d, a.SingleVal(t)))
		default:
			d.Fatalf(t, "unknown argument %q", a.Key)
		}
	}
	return &policyTrace{p: newPolicy(o, policyT0), now: policyT0, ds: map[string]*dstate{}}
}

func (w *policyTrace) run(t *testing.T, d *datadriven.TestData) string {
	switch d.Cmd {
	case "tick":
		if len(d.CmdArgs) != 1 {
			d.Fatalf(t, "tick D")
		}
		w.now = w.now.Add(traceDuration(t, d, d.CmdArgs[0].Key))
		return ""
	case "take":
		for line := range strings.Lines(d.Input) {
			fields := strings.Fields(line)
			if len(fields) == 0 {
				continue
			}
			w.p.add(w.dstate(fields[0]), w.op(t, d, fields[1:]), w.now)
		}
		return ""
	case "round":
		return w.round(t, d)
	}
	d.Fatalf(t, "unknown command %q", d.Cmd)
	return ""
}

// round is lane.run's step after a take, with the outcome the script
// gives the commit (lane.commitAll, apply).
func (w *policyTrace) round(t *testing.T, d *datadriven.TestData) string {
	var fail, stop []string
	var lost, superseded bool
	draining := d.HasArg("draining")
	for _, a := range d.CmdArgs {
		switch a.Key {
		case "draining":
		case "fail":
			fail = a.Vals
		case "stop":
			stop = a.Vals
		case "lost":
			lost = true
		case "superseded":
			superseded = true
		default:
			d.Fatalf(t, "unknown argument %q", a.Key)
		}
	}
	if !w.p.due(w.now, draining) {
		if warmAllowed(w.p.deadline(), w.now) {
			return "nothing due: the lane may warm\n"
		}
		return "nothing due\n"
	}
	ds := w.p.pick(w.now, draining)
	var b strings.Builder
	fmt.Fprintf(&b, "commit %s: ", w.names(ds))
	switch {
	case superseded:
		b.WriteString("superseded, everything dropped\n")
		w.p.dropAll()
	case lost:
		b.WriteString("the target lost, the work kept\n")
	case len(fail)+len(stop) > 0:
		b.WriteString("refused; one by one:\n")
		for _, ds1 := range ds {
			name := w.name(ds1)
			switch {
			case slices.Contains(fail, name) || slices.Contains(stop, name):
				s := w.p.failed(ds1, slices.Contains(stop, name))
				fmt.Fprintf(&b, "  %s failed (%d in a row)", name, ds1.failures)
				if s {
					b.WriteString(", its table stops")
				}
				b.WriteByte('\n')
			default:
				w.p.committed([]*dstate{ds1}, w.now)
				fmt.Fprintf(&b, "  %s committed\n", name)
			}
		}
	default:
		b.WriteString("committed\n")
		w.p.committed(ds, w.now)
	}
	w.p.endRound(w.now, w.now)
	return b.String()
}

func (w *policyTrace) dstate(name string) *dstate {
	d := w.ds[name]
	if d == nil {
		n, _ := strconv.ParseUint(strings.TrimPrefix(name, "d"), 10, 64)
		d = &dstate{id: common.DispatcherIDFromUint64(n)}
		w.ds[name] = d
	}
	return d
}

func (w *policyTrace) op(t *testing.T, d *datadriven.TestData, fields []string) op {
	var o op
	var rows int
	var behind time.Duration
	for _, f := range fields {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "rows":
			o.kind, rows = opRows, traceInt(t, d, v)
		case "behind":
			behind = traceDuration(t, d, v)
		case "bytes":
			o.bytes = int64(traceInt(t, d, v))
		case "ckpt":
			o.kind, o.ts = opCheckpoint, common.Ts(traceInt(t, d, v))
		case "ddl":
			o.kind = opDDL
		case "begin":
			o.kind, o.epoch = opBegin, uint64(traceInt(t, d, v))
		default:
			d.Fatalf(t, "unknown op field %q", f)
		}
	}
	for range rows {
		o.rows = append(o.rows, common.Row{CommitTs: common.TsFromTime(w.now.Add(-behind))})
	}
	return o
}

func (w *policyTrace) name(d *dstate) string {
	for n, x := range w.ds {
		if x == d {
			return n
		}
	}
	return "?"
}

func (w *policyTrace) names(ds []*dstate) string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = w.name(d)
	}
	return strings.Join(out, " ")
}

func (w *policyTrace) at(t time.Time) string { return "+" + t.Sub(policyT0).String() }

func (w *policyTrace) dump() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: pending %d, ", w.at(w.now), w.p.pending)
	if w.p.pendingBytes != 0 {
		fmt.Fprintf(&b, "%d bytes, ", w.p.pendingBytes)
	}
	if dl := w.p.deadline(); dl.IsZero() {
		b.WriteString("no deadline")
	} else {
		fmt.Fprintf(&b, "deadline %s", w.at(dl))
	}
	fmt.Fprintf(&b, ", warm %s, due ", map[bool]string{true: "yes", false: "no"}[warmAllowed(w.p.deadline(), w.now)])
	if !w.p.due(w.now, false) {
		b.WriteString("none")
	} else {
		b.WriteString(w.names(w.p.pick(w.now, false)))
	}
	if w.p.drainDue(true) {
		b.WriteString(" (draining: " + w.names(w.p.pick(w.now, true)) + ")")
	}
	b.WriteByte('\n')
	for _, d := range w.p.held {
		fmt.Fprintf(&b, "  %s epoch %d:", w.name(d), d.epoch)
		for _, o := range d.work {
			switch o.kind {
			case opRows:
				fmt.Fprintf(&b, " rows(%d)", len(o.rows))
			case opDDL:
				b.WriteString(" ddl")
			case opCheckpoint:
				fmt.Fprintf(&b, " ckpt(%d)", o.ts)
			}
		}
		if len(d.work) == 0 {
			b.WriteString(" nothing")
		}
		if !d.written.IsZero() {
			fmt.Fprintf(&b, ", written %s", w.at(d.written))
		}
		if d.broken {
			b.WriteString(", broken")
		}
		b.WriteByte('\n')
	}
	return b.String()
}

func traceDuration(t *testing.T, d *datadriven.TestData, s string) time.Duration {
	v, err := time.ParseDuration(s)
	if err != nil {
		d.Fatalf(t, "%v", err)
	}
	return v
}

func traceInt(t *testing.T, d *datadriven.TestData, s string) int {
	v, err := strconv.Atoi(s)
	if err != nil {
		d.Fatalf(t, "%v", err)
	}
	return v
}

// A failed send's error is classified once, for every path that sends
// (classify): the sink closing first, then the fence's refusal, then the
// data's fault found before the server saw it, then the server's
// connection and shutdown classes; any other server error is the table's,
// any error the server did not send the connection's.
func TestAFailedSendIsClassifiedOnce(t *testing.T) {
	superseded := &pgconn.PgError{Code: fenceSQLState}
	for i, tt := range []struct {
		closing bool
		err     error
		want    failure
	}{
		{false, nil, failNone},
		{true, nil, failNone},
		{true, fmt.Errorf("%w: %w", ErrApply, superseded), failClosing},
		{true, io.ErrUnexpectedEOF, failClosing},
		{false, fmt.Errorf("%w: %w", ErrApply, superseded), failSuperseded},
		{false, fmt.Errorf("%w: t: %w", ErrSchemaChange, errors.New("column gone")), failTable},
		{false, fmt.Errorf("%w: %w: t: x", ErrApply, errBadData), failTable},
		{false, fmt.Errorf("%w: %w", ErrApply, &pgconn.PgError{Code: "22P02"}), failTable},
		{false, fmt.Errorf("%w: %w", ErrApply, &pgconn.PgError{Code: "08P01"}), failTable},
		{false, fmt.Errorf("%w: %w", ErrApply, &pgconn.PgError{Code: "08006"}), failLost},
		{false, fmt.Errorf("%w: %w", ErrApply, &pgconn.PgError{Code: "57P01"}), failLost},
		{false, fmt.Errorf("%w: %w", ErrApply, io.ErrUnexpectedEOF), failLost},
		{false, context.DeadlineExceeded, failLost},
	} {
		require.Equal(t, tt.want, classify(tt.closing, tt.err), "#%d: %v", i, tt.err)
	}
}

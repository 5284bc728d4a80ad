package pendingset

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/clock"
)

// TestTraces runs the scripts in testdata/trace. Each drives one Set of
// string keys and uint64 values (Merge keeps the larger: "the newest
// resolved-ts") on a fake clock without jitter through adds, drains,
// completions and clock advances, and prints, after every command, every
// key the set knows with its state, the ready FIFO's order and the
// counters the command moved. The set's structural invariants are checked
// after every command. Rewrite the expectations with
// `go test ./pkg/pendingset -run TestTraces -rewrite` and read the diff.
//
// Commands:
//
//	new [max-batch=N] [max-attempts=N] [backoff-base=D] [backoff-max=D]
//	    [quarantine-retry=D] [supersedes] [bypass]
//	add k=v ...                     Add, in the order given
//	add-many k=v ...                one AddMany
//	drain [limit=N]                 prints "batch N: k=v(attempts) ..."
//	complete batch=N [failed=k,...] [retry=k,...] [err=down|permanent]
//	advance D                       moves the fake clock
//	next-due                        NextDue
//	doorbell                        whether the doorbell rang (and takes its token)
func TestTraces(t *testing.T) {
	datadriven.Walk(t, "testdata/trace", func(t *testing.T, path string) {
		var w *traceSet
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd == "new" {
				w = newTraceSet(t, d)
				return w.dump()
			}
			require.NotNil(t, w, "%s: the script must start with new", d.Pos)
			out := w.run(t, d)
			checkInvariants(t, w.s)
			return out + w.dump()
		})
	})
}

// traceSet is one script's set, its clock and the batches it has drained.
type traceSet struct {
	s       *Set[string, uint64]
	clk     *clock.Fake
	batches map[int][]Entry[string, uint64]
	next    int
	last    Stats
}

func newTraceSet(t *testing.T, d *datadriven.TestData) *traceSet {
	clk := clock.NewFake(t0)
	o := Options[string, uint64]{Merge: maxMerge, Clock: clk, Rand: func() float64 { return 0 }}
	for _, a := range d.CmdArgs {
		switch a.Key {
		case "max-batch":
			o.MaxBatch = traceInt(t, d, a)
		case "max-attempts":
			o.MaxAttempts = traceInt(t, d, a)
		case "backoff-base":
			o.BackoffBase = traceDuration(t, d, a)
		case "backoff-max":
			o.BackoffMax = traceDuration(t, d, a)
		case "quarantine-retry":
			o.QuarantineRetry = traceDuration(t, d, a)
		case "supersedes":
			o.Supersedes = func(v, delivered uint64) bool { return v > delivered }
		case "bypass":
			// A fresh value newer than the waiting one cures the failure
			// (a new epoch, say).
			o.Bypass = func(waiting, fresh uint64) bool { return fresh > waiting }
		default:
			d.Fatalf(t, "new: unknown argument %q", a.Key)
		}
	}
	s, err := New(o)
	require.NoError(t, err)
	return &traceSet{s: s, clk: clk, batches: map[int][]Entry[string, uint64]{}}
}

func (w *traceSet) run(t *testing.T, d *datadriven.TestData) string {
	switch d.Cmd {
	case "add", "add-many":
		var keys []string
		var vals []uint64
		for _, a := range d.CmdArgs {
			keys = append(keys, a.Key)
			vals = append(vals, uint64(traceInt(t, d, a)))
		}
		if d.Cmd == "add-many" {
			w.s.AddMany(keys, vals)
		} else {
			for i := range keys {
				w.s.Add(keys[i], vals[i])
			}
		}
		return ""
	case "drain":
		limit := 0
		for _, a := range d.CmdArgs {
			if a.Key != "limit" {
				d.Fatalf(t, "drain: unknown argument %q", a.Key)
			}
			limit = traceInt(t, d, a)
		}
		b := w.s.Drain(limit, nil)
		if len(b) == 0 {
			return "nothing to drain\n"
		}
		w.next++
		w.batches[w.next] = b
		var sb strings.Builder
		fmt.Fprintf(&sb, "batch %d:", w.next)
		for _, e := range b {
			fmt.Fprintf(&sb, " %s=%d", e.Key, e.Value)
			if e.Attempts > 0 {
				fmt.Fprintf(&sb, "(attempts %d)", e.Attempts)
			}
		}
		return sb.String() + "\n"
	case "complete":
		return w.complete(t, d)
	case "advance":
		require.Len(t, d.CmdArgs, 1, "%s: advance D", d.Pos)
		dur, err := time.ParseDuration(d.CmdArgs[0].Key)
		require.NoError(t, err, d.Pos)
		w.clk.Advance(dur)
		return ""
	case "next-due":
		due, ok := w.s.NextDue()
		if !ok {
			return "next due: none\n"
		}
		return fmt.Sprintf("next due: in %v\n", due.Sub(w.clk.Now()))
	case "doorbell":
		select {
		case <-w.s.Doorbell():
			return "doorbell: rang\n"
		default:
			return "doorbell: silent\n"
		}
	default:
		d.Fatalf(t, "unknown command %q", d.Cmd)
		return ""
	}
}

// complete sets each listed key's Result in a drained batch and completes
// it, with a whole-batch error when err= is given.
func (w *traceSet) complete(t *testing.T, d *datadriven.TestData) string {
	var b []Entry[string, uint64]
	var err error
	for _, a := range d.CmdArgs {
		switch a.Key {
		case "batch":
			n := traceInt(t, d, a)
			var ok bool
			b, ok = w.batches[n]
			require.True(t, ok, "%s: no batch %d", d.Pos, n)
		case "failed", "retry":
			r := FailedKey
			if a.Key == "retry" {
				r = RetryKey
			}
			for _, k := range a.Vals {
				i := slices.IndexFunc(b, func(e Entry[string, uint64]) bool { return e.Key == k })
				require.GreaterOrEqual(t, i, 0, "%s: %s is not in the batch (batch= comes first)", d.Pos, k)
				b[i].Result = r
			}
		case "err":
			err = errors.New("connection down")
			if a.Vals[0] == "permanent" {
				err = Permanent(err)
			}
		default:
			d.Fatalf(t, "complete: unknown argument %q", a.Key)
		}
	}
	if cerr := w.s.Complete(b, err); cerr != nil {
		return fmt.Sprintf("complete: %v\n", cerr)
	}
	return ""
}

// dump prints every key the set knows (held or idle, in key order) with
// its state, the ready FIFO, and the counters that moved since the last
// dump.
func (w *traceSet) dump() string {
	var sb strings.Builder
	w.s.mu.Lock()
	type row struct{ key, line string }
	var rows []row
	for i := range w.s.mu.nodes {
		sl, n := &w.s.mu.slots[i], &w.s.mu.nodes[i]
		line := sl.state.String()
		if sl.state != stateIdle && (sl.state != stateInFlight || sl.dirty) {
			line += fmt.Sprintf(" val=%d", sl.val)
		}
		if sl.dirty {
			line += " dirty"
		}
		if n.attempts > 0 {
			line += fmt.Sprintf(" attempts=%d", n.attempts)
		}
		if sl.state == stateBackoff || sl.state == stateQuarantined {
			line += fmt.Sprintf(" due-in=%v", time.Duration(n.due-w.s.nowLocked()))
		}
		if int(i) < len(w.s.mu.delivered) && w.s.mu.delivered[i].ok {
			line += fmt.Sprintf(" last-delivered=%d", w.s.mu.delivered[i].v)
		}
		rows = append(rows, row{sl.key, line})
	}
	var ready []string
	for j := range w.s.mu.ready.len {
		ready = append(ready, w.s.mu.slots[w.s.mu.ready.at(j)].key)
	}
	w.s.mu.Unlock()
	slices.SortFunc(rows, func(a, b row) int { return strings.Compare(a.key, b.key) })
	for _, r := range rows {
		fmt.Fprintf(&sb, "  %s: %s\n", r.key, r.line)
	}
	fmt.Fprintf(&sb, "ready: [%s]", strings.Join(ready, " "))
	st := w.s.Stats()
	fmt.Fprintf(&sb, " len=%d in-flight=%d", st.Len, st.InFlight)
	moved := traceMoved(w.last, st)
	if moved != "" {
		sb.WriteString("; " + moved)
	}
	w.last = st
	return sb.String() + "\n"
}

// traceMoved names the counters of Stats that moved from a to b.
func traceMoved(a, b Stats) string {
	var out []string
	for _, c := range []struct {
		name string
		a, b uint64
	}{
		{"coalesced", a.Coalesced, b.Coalesced},
		{"delivered", a.Delivered, b.Delivered},
		{"batch-failures", a.BatchFailures, b.BatchFailures},
		{"key-failures", a.KeyFailures, b.KeyFailures},
		{"key-retries", a.KeyRetries, b.KeyRetries},
		{"bypasses", a.Bypasses, b.Bypasses},
		{"superseded", a.Superseded, b.Superseded},
		{"quarantines", a.Quarantines, b.Quarantines},
		{"readmissions", a.Readmissions, b.Readmissions},
	} {
		if c.b != c.a {
			out = append(out, fmt.Sprintf("%s+%d", c.name, c.b-c.a))
		}
	}
	return strings.Join(out, " ")
}

func traceInt(t *testing.T, d *datadriven.TestData, a datadriven.CmdArg) int {
	require.Len(t, a.Vals, 1, "%s: %s=N", d.Pos, a.Key)
	n, err := strconv.Atoi(a.Vals[0])
	require.NoError(t, err, "%s: %s", d.Pos, a.Key)
	return n
}

func traceDuration(t *testing.T, d *datadriven.TestData, a datadriven.CmdArg) time.Duration {
	require.Len(t, a.Vals, 1, "%s: %s=D", d.Pos, a.Key)
	v, err := time.ParseDuration(a.Vals[0])
	require.NoError(t, err, "%s: %s", d.Pos, a.Key)
	return v
}

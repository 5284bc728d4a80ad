package eventservice

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"

	"github.com/cdcflow/eventservice/pkg/common"
)

// The trace tests drive the scheduler's pure parts from scripts in
// testdata/, as etcd raft and pebble drive their state machines: each
// command prints what the step decided, and `go test -run Trace -rewrite`
// regenerates the expected output after a deliberate change (read the diff:
// it is the change in behaviour).

// TestTransitionTrace: testdata/transition fires events at one session's
// scheduling word (the pure transition table, through sched.fire) and
// prints the action and the state reached after each.
//
//	new                   a fresh session (idle)
//	fire <event>...       events in order; one line each: action -> state
func TestTransitionTrace(t *testing.T) {
	var s *sched // the script's session: its commands share it
	datadriven.RunTest(t, "testdata/transition", func(t *testing.T, d *datadriven.TestData) string {
		switch d.Cmd {
		case "new":
			s = &sched{}
			st, _ := s.load()
			return st.String() + "\n"
		case "fire":
			if s == nil {
				d.Fatalf(t, "fire before new")
			}
			var b strings.Builder
			for _, arg := range d.CmdArgs {
				e, ok := eventByName(arg.Key)
				if !ok {
					d.Fatalf(t, "unknown event %q", arg.Key)
				}
				act, _ := s.fire(e)
				st, pending := s.load()
				fmt.Fprintf(&b, "%s: %s -> %s", e, act, st)
				if pending {
					b.WriteString(" +pending")
				}
				b.WriteByte('\n')
			}
			return b.String()
		}
		d.Fatalf(t, "unknown command %q", d.Cmd)
		return ""
	})
}

func eventByName(name string) (event, bool) {
	for e := range numEvents {
		if e.String() == name {
			return e, true
		}
	}
	return 0, false
}

// TestDecideTrace: testdata/decide runs the pure part of preparation,
// decideScan, on the inputs given and prints its decision.
//
//	decide resolved=R received=N maxcommit=M schema=S lastddl=L [cursor]
func TestDecideTrace(t *testing.T) {
	datadriven.RunTest(t, "testdata/decide", func(t *testing.T, d *datadriven.TestData) string {
		if d.Cmd != "decide" {
			d.Fatalf(t, "unknown command %q", d.Cmd)
		}
		ts := func(key string) common.Ts {
			var v uint64
			d.ScanArgs(t, key, &v)
			return common.Ts(v)
		}
		in := decideInput{resolved: ts("resolved"), cursor: d.HasArg("cursor"), received: ts("received"),
			maxCommit: ts("maxcommit"), schemaTs: ts("schema"), lastDDL: ts("lastddl")}
		dec := decideScan(in)
		out := outcomeNames[dec.outcome]
		if dec.advance != 0 {
			out += fmt.Sprintf(" advance=%d", dec.advance)
		}
		if dec.outcome == outcomeSchemaBlocked {
			out += fmt.Sprintf(" blocked-at=%d", dec.blockedAt)
		}
		return out + "\n"
	})
}

// TestResolvedMergeTrace: testdata/resolved runs the resolved set's merge
// rule, newerResolved, which keeps one pending advance per dispatcher: the
// third step of the ordering argument (docs/design/eventservice.md) is that
// coalescing never swaps an old value in for a newer one.
//
//	sessions <name>...     live sessions (epochs come with the values)
//	retire <name>          the session is reset or removed
//	merge old=<session>/<epoch>/<ts> fresh=<session>/<epoch>/<ts>
//	                       prints which value the set keeps
func TestResolvedMergeTrace(t *testing.T) {
	var byName map[string]*session
	datadriven.RunTest(t, "testdata/resolved", func(t *testing.T, d *datadriven.TestData) string {
		switch d.Cmd {
		case "sessions":
			byName = map[string]*session{}
			for _, arg := range d.CmdArgs {
				byName[arg.Key] = &session{}
			}
			return "ok\n"
		case "retire":
			s := byName[d.CmdArgs[0].Key]
			if s == nil {
				d.Fatalf(t, "unknown session %q", d.CmdArgs[0].Key)
			}
			s.sched.fire(evRemove)
			return "ok\n"
		case "merge":
			value := func(key string) (resolvedValue, string) {
				var spec string
				d.ScanArgs(t, key, &spec)
				parts := strings.Split(spec, "/")
				if len(parts) != 3 || byName[parts[0]] == nil {
					d.Fatalf(t, "%s=%q: want <session>/<epoch>/<ts>", key, spec)
				}
				epoch, err1 := strconv.ParseUint(parts[1], 10, 64)
				ts, err2 := strconv.ParseUint(parts[2], 10, 64)
				if err1 != nil || err2 != nil {
					d.Fatalf(t, "%s=%q: want numbers", key, spec)
				}
				return resolvedValue{s: byName[parts[0]], epoch: epoch, ts: common.Ts(ts)}, spec
			}
			old, oldSpec := value("old")
			fresh, freshSpec := value("fresh")
			switch kept := newerResolved(old, fresh); kept {
			case fresh:
				return "fresh " + freshSpec + "\n"
			case old:
				return "old " + oldSpec + "\n"
			}
			return "neither\n"
		}
		d.Fatalf(t, "unknown command %q", d.Cmd)
		return ""
	})
}

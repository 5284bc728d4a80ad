package synthetic

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/cmd/cdcserver/app/exitcode"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventcollector"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/pebblesink"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

func TestDecideVerdictAndExitStatus(t *testing.T) {
	for _, tc := range []struct {
		drained    bool
		violations int
		verdict    string
		exit       int
	}{
		{true, 0, VerdictVerified, exitcode.OK},
		{false, 0, VerdictNotDrained, exitcode.NotDrained},
		{true, 1, VerdictFailed, exitcode.Failed},
		{false, 3, VerdictFailed, exitcode.Failed}, // a proven loss outweighs lateness
	} {
		require.Equal(t, tc.verdict, decideVerdict(tc.drained, tc.violations), "%+v", tc)
		sum := Summary{Drained: tc.drained, MissingRows: tc.violations}
		require.Equal(t, tc.exit, ExitStatus(sum), "%+v", tc)
	}
	require.NotEqual(t, exitcode.NotDrained, exitcode.Setup)
	for _, v := range []func(*Summary){
		func(s *Summary) { s.LostWakeups = 1 }, func(s *Summary) { s.OrderViolations = 1 }, func(s *Summary) { s.Duplicates = 1 },
		func(s *Summary) { s.UnexpectedRows = 1 }, func(s *Summary) { s.DDLMismatches = 1 }, func(s *Summary) { s.SinkErrors = 1 },
	} {
		s := Summary{Drained: false}
		v(&s)
		require.Equal(t, exitcode.Failed, ExitStatus(s), "%+v", s)
	}
	// Undelivered rows and behind dispatchers are not violations.
	require.Equal(t, exitcode.NotDrained, ExitStatus(Summary{BehindDispatchers: 5, UndeliveredRows: 100, UndeliveredDDLs: 2}))
}

// verdictFixture is one dispatcher: upstream rows at commit-ts 10..50 and
// DDLs at 20 and 40; its sink holds got and gotDDLs with checkpoint ckpt.
func verdictFixture(t *testing.T, got []common.Ts, gotDDLs []common.Ts, ckpt common.Ts, behind bool) Summary {
	t.Helper()
	row := func(ts common.Ts) common.Row {
		return common.Row{Key: []byte{byte(ts)}, CommitTs: ts, StartTs: ts - 1, Op: common.OpPut, Value: []byte{byte(ts)}}
	}
	var want, have []common.Row
	for ts := common.Ts(10); ts <= 50; ts += 10 {
		want = append(want, row(ts))
	}
	for _, ts := range got {
		have = append(have, row(ts))
	}
	wantDDLs := []schemastore.DDL{{TableID: 1, CommitTs: 20, Query: "q20"}, {TableID: 1, CommitTs: 40, Query: "q40"}}
	var haveDDLs []messaging.DDL
	for _, ts := range gotDDLs {
		haveDDLs = append(haveDDLs, messaging.DDL{TableID: 1, CommitTs: ts, Query: "q" + string('0'+byte(ts/10)) + "0"})
	}
	d := dispatcherRef{id: common.DispatcherIDFromUint64(1), table: 1}
	var sum Summary
	sum.Dispatchers = 1
	sum.Drained = !behind
	if behind {
		sum.BehindDispatchers = 1
	}
	w := windowOf(50, ckpt, behind)
	diffRows(&sum, d, want, have, w)
	compareDDLs(&sum, d, haveDDLs, wantDDLs, w)
	var versions []pebblesink.Version
	for i, r := range have {
		versions = append(versions, pebblesink.Version{Key: r.Key, CommitTs: r.CommitTs, Seq: uint64(i + 1), Op: r.Op, Value: r.Value})
	}
	var durable Summary
	verifyVersions(&durable, d, want, versions, w)
	require.Equal(t, sum.MissingRows, durable.MissingRows, "the durable path counts as the memory path")
	require.Equal(t, sum.UndeliveredRows, durable.UndeliveredRows)
	require.Equal(t, sum.UnexpectedRows, durable.UnexpectedRows)
	sum.Verdict = decideVerdict(sum.Drained, sum.violations())
	return sum
}

func TestVerdictOfBehindAndDrainedDispatchers(t *testing.T) {
	t.Run("behind, everything at or below its checkpoint there", func(t *testing.T) {
		s := verdictFixture(t, []common.Ts{10, 20, 30}, []common.Ts{20}, 30, true)
		require.Zero(t, s.MissingRows)
		require.EqualValues(t, 2, s.UndeliveredRows, "40 and 50 are late, not lost")
		require.Equal(t, 1, s.UndeliveredDDLs)
		require.Zero(t, s.DDLMismatches)
		require.Equal(t, VerdictNotDrained, s.Verdict)
		require.Equal(t, exitcode.NotDrained, ExitStatus(s))
	})
	t.Run("behind, with rows received above its checkpoint", func(t *testing.T) {
		s := verdictFixture(t, []common.Ts{10, 20, 30, 40}, []common.Ts{20, 40}, 20, true)
		require.Zero(t, s.MissingRows)
		require.EqualValues(t, 1, s.UndeliveredRows)
		require.Zero(t, s.UndeliveredDDLs)
		require.Equal(t, VerdictNotDrained, s.Verdict)
	})
	t.Run("behind, a row at or below its checkpoint missing", func(t *testing.T) {
		s := verdictFixture(t, []common.Ts{10, 30}, []common.Ts{20}, 30, true)
		require.Equal(t, 1, s.MissingRows, "20 is certified by checkpoint 30: lost even though the run did not drain")
		require.EqualValues(t, 2, s.UndeliveredRows)
		require.Equal(t, VerdictFailed, s.Verdict)
		require.Equal(t, exitcode.Failed, ExitStatus(s))
	})
	t.Run("behind, a DDL at or below its checkpoint missing", func(t *testing.T) {
		s := verdictFixture(t, []common.Ts{10, 20, 30}, nil, 30, true)
		require.Equal(t, 1, s.DDLMismatches)
		require.Equal(t, VerdictFailed, s.Verdict)
	})
	t.Run("behind, a row the upstream never produced", func(t *testing.T) {
		s := verdictFixture(t, []common.Ts{10, 15}, nil, 10, true)
		require.Equal(t, 1, s.UnexpectedRows)
		require.Equal(t, VerdictFailed, s.Verdict)
	})
	t.Run("behind, caught up by verification", func(t *testing.T) {
		s := verdictFixture(t, []common.Ts{10, 20, 40, 50}, []common.Ts{20, 40}, 50, true)
		require.Equal(t, 1, s.MissingRows, "its sink certified everything: a gap is loss")
		require.Zero(t, s.UndeliveredRows)
	})
	t.Run("drained, the same gaps are loss", func(t *testing.T) {
		s := verdictFixture(t, []common.Ts{10, 20, 30}, []common.Ts{20}, 50, false)
		require.Equal(t, 2, s.MissingRows)
		require.Zero(t, s.UndeliveredRows)
		require.Equal(t, 1, s.DDLMismatches)
		require.Equal(t, VerdictFailed, s.Verdict)
	})
	t.Run("drained and complete", func(t *testing.T) {
		s := verdictFixture(t, []common.Ts{10, 20, 30, 40, 50}, []common.Ts{20, 40}, 50, false)
		require.Zero(t, s.violations())
		require.Equal(t, VerdictVerified, s.Verdict)
		require.Equal(t, exitcode.OK, ExitStatus(s))
	})
}

func TestSlowestBehindAndVerdictLine(t *testing.T) {
	ms := func(m int64) common.Ts { return common.ComposeTs(1_700_000_000_000+m, 0) }
	a, b, c := common.DispatcherIDFromUint64(3), common.DispatcherIDFromUint64(1), common.DispatcherIDFromUint64(2)
	finals := map[common.DispatcherID]common.Ts{a: ms(1000), b: ms(1000), c: ms(1000)}
	late := map[common.DispatcherID]lateAt{a: {table: 3, ckpt: ms(200)}, b: {table: 1, ckpt: ms(200)}, c: {table: 2, ckpt: ms(900)}}
	for range 10 { // map order must not matter
		id, lag, ok := slowestBehind(late, finals)
		require.True(t, ok)
		require.Equal(t, b, id, "the smallest ID among the slowest")
		require.Equal(t, 800*time.Millisecond, lag)
	}
	_, _, ok := slowestBehind(nil, finals)
	require.False(t, ok)
	require.Zero(t, lagOf(ms(5), ms(9)), "a checkpoint past its target is no lag")

	s := Summary{Dispatchers: 40, BehindDispatchers: 3, UndeliveredRows: 12, SlowestLagMs: 800}
	require.Equal(t, "NOT DRAINED: 3 of 40 dispatchers behind the upstream's final resolved-ts at the drain deadline, 12 rows undelivered, slowest lag 800.0 ms; nothing delivered contradicts the upstream", verdictLine(s))
	s.OrderViolations = 1
	require.Contains(t, verdictLine(s), "VERIFICATION FAILED (and NOT DRAINED: 3 of 40")
	require.Equal(t, "VERIFIED", verdictLine(Summary{Drained: true}))
	require.Equal(t, "VERIFICATION FAILED", verdictLine(Summary{Drained: true, MissingRows: 1}))
}

// errHeld is what holdingSink answers for its dispatcher once released: a
// downstream that stopped taking that dispatcher's changes.
var errHeld = errors.New("held by the test")

// holdingSink holds the first ApplyRows call it sees until the run is over
// (runHooks.beforeStop), then fails every later call of that dispatcher.
// While it holds, the collector's receive goroutine is in the call, so no
// dispatcher of the changefeed can take another message: none of them can
// reach the final resolved-ts before the drain deadline, whatever the
// timing, and the held rows are never applied.
type holdingSink struct {
	eventcollector.Sink
	release  chan struct{}
	released sync.Once
	mu       sync.Mutex
	held     *common.DispatcherID
}

func newHoldingSink(inner eventcollector.Sink) *holdingSink {
	return &holdingSink{Sink: inner, release: make(chan struct{})}
}

func (h *holdingSink) Release() { h.released.Do(func() { close(h.release) }) }

func (h *holdingSink) isHeld(id common.DispatcherID) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.held != nil && *h.held == id
}

func (h *holdingSink) heldID() (common.DispatcherID, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.held == nil {
		return common.DispatcherID{}, false
	}
	return *h.held, true
}

func (h *holdingSink) ApplyRows(id common.DispatcherID, rows []common.Row) error {
	h.mu.Lock()
	first := h.held == nil
	if first {
		h.held = &id
	}
	h.mu.Unlock()
	if first {
		<-h.release
		return errHeld
	}
	if h.isHeld(id) {
		return errHeld
	}
	return h.Sink.ApplyRows(id, rows)
}

func (h *holdingSink) BeginEpoch(id common.DispatcherID, epoch uint64, startTs common.Ts) error {
	if h.isHeld(id) {
		return errHeld
	}
	return h.Sink.BeginEpoch(id, epoch, startTs)
}

func (h *holdingSink) ApplyDDL(id common.DispatcherID, ddl *messaging.DDL) error {
	if h.isHeld(id) {
		return errHeld
	}
	return h.Sink.ApplyDDL(id, ddl)
}

func (h *holdingSink) Checkpoint(id common.DispatcherID, ts common.Ts) error {
	if h.isHeld(id) {
		return errHeld
	}
	return h.Sink.Checkpoint(id, ts)
}

// TestRunThatCannotDrainSaysNotDrained runs the server with changefeed 1's
// sink held from its first rows until the run is over: delivery cannot
// drain by the deadline. The verdict must say so (not drained, exit status
// 3, how many behind, rows undelivered, the slowest lag) and report no
// lost wakeup or missing row, since nothing was lost. Both sinks: the
// memory sink and the durable one.
func TestRunThatCannotDrainSaysNotDrained(t *testing.T) {
	for _, durable := range []bool{false, true} {
		name := "memory sink"
		if durable {
			name = "durable sink"
		}
		t.Run(name, func(t *testing.T) {
			cfg := smallConfig()
			cfg.Duration, cfg.DrainTimeout = 500*time.Millisecond, 200*time.Millisecond
			cfg.JSON = true
			if durable {
				cfg.Changefeeds, cfg.DurableSink, cfg.DataDir = 1, true, t.TempDir()
			}
			var hold *holdingSink
			hooks := runHooks{
				wrapSink: func(feed int, sink eventcollector.Sink) eventcollector.Sink {
					if feed != 1 {
						return sink
					}
					hold = newHoldingSink(sink)
					return hold
				},
				beforeStop: func() { hold.Release() },
			}
			var out, errOut bytes.Buffer
			sum, err := run(context.Background(), cfg, &out, &errOut, hooks)
			require.NoError(t, err, errOut.String())
			heldID, held := hold.heldID()
			require.True(t, held, "the sink held a call")

			require.Equal(t, VerdictNotDrained, sum.Verdict, "%+v", sum.Problems)
			require.False(t, sum.Verified)
			require.False(t, sum.Drained)
			require.False(t, sum.Complete)
			require.Equal(t, exitcode.NotDrained, ExitStatus(sum))
			require.Empty(t, sum.Problems, "nothing delivered is wrong")
			require.Zero(t, sum.LostWakeups, "late is not lost")
			require.Zero(t, sum.MissingRows, "late is not missing")
			require.Zero(t, sum.OrderViolations+sum.Duplicates+sum.UnexpectedRows+sum.DDLMismatches+sum.SinkErrors)
			require.GreaterOrEqual(t, sum.BehindDispatchers, 1)
			require.LessOrEqual(t, sum.BehindDispatchers, sum.Dispatchers)
			require.Positive(t, sum.UndeliveredRows, "the held rows were never applied")
			require.Equal(t, sum.RowsUpstream, sum.RowsDelivered+sum.UndeliveredRows, "every upstream row is delivered or undelivered")
			require.Positive(t, sum.SlowestLagMs)
			require.Contains(t, sum.SlowestDispatcher, "at the drain deadline")
			require.Contains(t, errOut.String(), "drain timeout:")

			var decoded map[string]any
			require.NoError(t, json.Unmarshal(out.Bytes(), &decoded), out.String())
			require.Equal(t, false, decoded["drained"])
			require.Equal(t, VerdictNotDrained, decoded["verdict"])
			require.EqualValues(t, sum.BehindDispatchers, decoded["behind_dispatchers"])
			require.EqualValues(t, sum.UndeliveredRows, decoded["undelivered_rows"])
			require.Contains(t, decoded, "slowest_lag_ms")

			var text bytes.Buffer
			require.NoError(t, writeSummary(&text, false, sum))
			require.Contains(t, text.String(), "NOT DRAINED: ")
			require.Contains(t, text.String(), "  not drained        ")
			require.NotContains(t, text.String(), "VERIFICATION FAILED")
			t.Logf("held %v; summary:\n%s", heldID, text.String())
		})
	}
}

// TestTheBehindSweepCostsWhatCatchesUp: a sweep that drops nobody looks at
// minSweep next time, one that drops many returns to the full budget
// within a few samples (doubling), and the budget never leaves its bounds.
func TestTheBehindSweepCostsWhatCatchesUp(t *testing.T) {
	require.Equal(t, minSweep, nextSweep(0))
	require.Equal(t, minSweep, nextSweep(minSweep/2))
	require.Equal(t, 2*minSweep, nextSweep(minSweep))
	require.Equal(t, maxSweep, nextSweep(maxSweep))
	b := minSweep
	samples := 0
	for b < maxSweep { // every dispatcher visited caught up
		b = nextSweep(b)
		samples++
	}
	require.LessOrEqual(t, samples, 4)
}

// TestTHPModeReadsTheSelectedWord: the summary's thp is the bracketed
// mode, and empty for a missing or unparseable file.
func TestTHPModeReadsTheSelectedWord(t *testing.T) {
	dir := t.TempDir()
	for content, want := range map[string]string{
		"always [madvise] never\n": "madvise",
		"[always] madvise never\n": "always",
		"always madvise [never]":   "never",
		"always madvise never\n":   "",
		"[]\n":                     "",
	} {
		p := filepath.Join(dir, "enabled")
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
		require.Equal(t, want, thpMode(p), "%q", content)
	}
	require.Equal(t, "", thpMode(filepath.Join(dir, "missing")))
}

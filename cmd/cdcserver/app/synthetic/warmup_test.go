package synthetic

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventcollector"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// stepClockForTest returns a clock that reads start, start+1s, ... on
// successive calls.
func stepClockForTest(start time.Time) func() time.Time {
	n := 0
	return func() time.Time {
		n++
		return start.Add(time.Duration(n-1) * time.Second)
	}
}

// TestWarmTrackerEndsAtTheLastDispatcher: nothing counts before arm or
// below liveFrom, a dispatcher counts once however often it passes, IDs
// outside the run's are ignored, and the warm-up ends at the checkpoint of
// the last dispatcher to pass, read from the clock then.
func TestWarmTrackerEndsAtTheLastDispatcher(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	w := newWarmTracker(2, 3, stepClockForTest(t0))
	id := func(feed, table uint64) common.DispatcherID { return common.DispatcherID{Hi: feed, Lo: table} }
	const from = common.Ts(100)

	w.note(id(1, 1), from) // not armed yet
	w.arm(from)
	w.note(id(1, 1), from-1) // below liveFrom
	require.EqualValues(t, 6, w.left.Load())

	for _, d := range []common.DispatcherID{id(1, 1), id(1, 1), id(1, 2), id(1, 3), id(2, 1), id(2, 2), id(0, 1), id(3, 1), id(1, 4), id(2, 0)} {
		w.note(d, from+5)
	}
	_, ok := w.done()
	require.False(t, ok, "table 3 of feed 2 has not passed")
	require.EqualValues(t, 1, w.left.Load())

	w.note(id(2, 3), from)
	at, ok := w.done()
	require.True(t, ok)
	require.Equal(t, t0, at, "read once, at the last dispatcher's checkpoint")
	w.note(id(2, 3), from+10) // after the end: nothing changes
	at2, _ := w.done()
	require.Equal(t, at, at2)
}

// checkpointSinkForTest is a synchronous sink (the edge the wrapper is
// about) whose Checkpoint and CheckpointBatch fail for the dispatchers in
// fail.
type checkpointSinkForTest struct {
	fail map[common.DispatcherID]bool
}

var errCheckpointForTest = errors.New("checkpoint refused")

func (s *checkpointSinkForTest) BeginEpoch(common.DispatcherID, uint64, common.Ts) error { return nil }
func (s *checkpointSinkForTest) ApplyRows(common.DispatcherID, []common.Row) error       { return nil }
func (s *checkpointSinkForTest) ApplyDDL(common.DispatcherID, *messaging.DDL) error      { return nil }
func (s *checkpointSinkForTest) Checkpoint(id common.DispatcherID, _ common.Ts) error {
	if s.fail[id] {
		return errCheckpointForTest
	}
	return nil
}

type batchSinkForTest struct{ checkpointSinkForTest }

func (s *batchSinkForTest) CheckpointBatch(cps []eventcollector.SinkCheckpoint, errs []error) {
	for i, cp := range cps {
		errs[i] = s.Checkpoint(cp.ID, cp.Ts)
	}
}

type asyncSinkForTest struct{ checkpointSinkForTest }

func (s *asyncSinkForTest) SetDurable(func(common.DispatcherID, uint64, common.Ts)) {}

// TestWrapWarmNotesOnlyConfirmedCheckpoints: the wrapper keeps a
// CheckpointBatcher a CheckpointBatcher (the collector's batched path),
// notes only the entries the sink confirmed, and leaves an AsyncSink (whose
// Checkpoint does not confirm) and a run without a tracker alone.
func TestWrapWarmNotesOnlyConfirmedCheckpoints(t *testing.T) {
	a, b := common.DispatcherID{Hi: 1, Lo: 1}, common.DispatcherID{Hi: 1, Lo: 2}
	fail := map[common.DispatcherID]bool{b: true}

	w := newWarmTracker(1, 2, time.Now)
	w.arm(10)
	plain := wrapWarm(&checkpointSinkForTest{fail: fail}, w)
	_, batches := plain.(eventcollector.CheckpointBatcher)
	require.False(t, batches)
	require.NoError(t, plain.Checkpoint(a, 10))
	require.ErrorIs(t, plain.Checkpoint(b, 10), errCheckpointForTest)
	require.EqualValues(t, 1, w.left.Load(), "the refused checkpoint does not count")

	w = newWarmTracker(1, 2, time.Now)
	w.arm(10)
	batched := wrapWarm(&batchSinkForTest{checkpointSinkForTest{fail: fail}}, w)
	cb, ok := batched.(eventcollector.CheckpointBatcher)
	require.True(t, ok)
	errs := make([]error, 2)
	cb.CheckpointBatch([]eventcollector.SinkCheckpoint{{ID: a, Ts: 10}, {ID: b, Ts: 10}}, errs)
	require.ErrorIs(t, errs[1], errCheckpointForTest)
	require.EqualValues(t, 1, w.left.Load())
	delete(fail, b)
	cb.CheckpointBatch([]eventcollector.SinkCheckpoint{{ID: b, Ts: 11}}, errs[:1])
	_, done := w.done()
	require.True(t, done)

	async := &asyncSinkForTest{}
	require.Same(t, async, wrapWarm(async, newWarmTracker(1, 1, time.Now)))
	sync := &checkpointSinkForTest{}
	require.Same(t, sync, wrapWarm(sync, nil))
}

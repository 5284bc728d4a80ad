package synthetic

import (
	"sync/atomic"
	"time"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventcollector"
)

// warmTracker notes the moment the warm-up ends: when the last dispatcher's
// sink confirmed a checkpoint at or past liveFrom. It sits in the sinks of
// the collectors in this process (warmSink), so it sees each confirmation
// as it happens, at the cost of a bit test per checkpoint until the
// warm-up is over and of an atomic load after.
//
// The monitor used to find the end by sweeping the dispatchers' checkpoints
// from its own goroutine, at most 50k lookups a sample so that the sweep
// did not take the cores from the run it measured. A pass over a million
// then took seconds, and a dispatcher seen behind early in a pass was looked
// at again only in the next: the warm-up it reported was late by up to a
// pass, and its passes took CPU from the catching up they waited for.
// With collectors in other processes the monitor still sweeps (their sinks
// are not here).
type warmTracker struct {
	feeds, tables int
	// from is liveFrom once armed (arm); zero before, when nothing counts.
	from atomic.Uint64
	// passed has a bit per dispatcher (feed-major, as the IDs are
	// numbered) set at its first checkpoint at or past from.
	passed []atomic.Uint64
	// left counts the dispatchers whose bit is not set.
	left atomic.Int64
	// doneAt is when left reached zero (Unix ns); zero until then.
	doneAt atomic.Int64
	now    func() time.Time
}

// newWarmTracker tracks feeds × tables dispatchers, numbered as cdcserver
// numbers them: {Hi: feed (1-based), Lo: table (1-based)}.
func newWarmTracker(feeds, tables int, now func() time.Time) *warmTracker {
	w := &warmTracker{feeds: feeds, tables: tables, now: now}
	n := feeds * tables
	w.passed = make([]atomic.Uint64, (n+63)/64)
	w.left.Store(int64(n))
	return w
}

// arm starts counting the checkpoints at or past from (liveFrom, before the
// upstream starts: no checkpoint can reach it earlier).
func (w *warmTracker) arm(from common.Ts) { w.from.Store(uint64(from)) }

// note records that id's sink confirmed ts.
func (w *warmTracker) note(id common.DispatcherID, ts common.Ts) {
	from := w.from.Load()
	if from == 0 || uint64(ts) < from || w.doneAt.Load() != 0 {
		return
	}
	if id.Hi < 1 || id.Hi > uint64(w.feeds) || id.Lo < 1 || id.Lo > uint64(w.tables) {
		return // not one of the run's dispatchers
	}
	i := (id.Hi-1)*uint64(w.tables) + id.Lo - 1
	bit := uint64(1) << (i % 64)
	if w.passed[i/64].Or(bit)&bit != 0 {
		return // counted already
	}
	if w.left.Add(-1) == 0 {
		w.doneAt.Store(w.now().UnixNano())
	}
}

// done reports whether every dispatcher passed from, and when the last did.
func (w *warmTracker) done() (time.Time, bool) {
	ns := w.doneAt.Load()
	if ns == 0 {
		return time.Time{}, false
	}
	return time.Unix(0, ns), true
}

// over reports whether the warm-up is over (a sink's shortcut).
func (w *warmTracker) over() bool { return w.doneAt.Load() != 0 }

// wrapWarm returns sink with w noting its confirmed checkpoints, keeping
// the optional interfaces the collector looks for (CheckpointBatcher). An
// AsyncSink is returned as it is (nil tracker use: its Checkpoint does
// not confirm), as is every sink when w is nil.
func wrapWarm(sink eventcollector.Sink, w *warmTracker) eventcollector.Sink {
	if w == nil {
		return sink
	}
	if _, ok := sink.(eventcollector.AsyncSink); ok {
		return sink
	}
	ws := warmSink{Sink: sink, w: w}
	if cb, ok := sink.(eventcollector.CheckpointBatcher); ok {
		return warmBatchSink{warmSink: ws, cb: cb}
	}
	return ws
}

// warmSink is a Sink whose confirmed checkpoints w notes.
type warmSink struct {
	eventcollector.Sink
	w *warmTracker
}

func (s warmSink) Checkpoint(id common.DispatcherID, ts common.Ts) error {
	err := s.Sink.Checkpoint(id, ts)
	if err == nil {
		s.w.note(id, ts)
	}
	return err
}

// warmBatchSink is a warmSink of a CheckpointBatcher.
type warmBatchSink struct {
	warmSink
	cb eventcollector.CheckpointBatcher
}

var _ eventcollector.CheckpointBatcher = warmBatchSink{}

func (s warmBatchSink) CheckpointBatch(cps []eventcollector.SinkCheckpoint, errs []error) {
	s.cb.CheckpointBatch(cps, errs)
	if s.w.over() {
		return
	}
	for i := range cps {
		if errs[i] == nil {
			s.w.note(cps[i].ID, cps[i].Ts)
		}
	}
}

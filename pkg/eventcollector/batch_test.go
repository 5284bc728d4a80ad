package eventcollector

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// slotOf is the slot dispatcher id's registration gave the service.
func (h *craftedForTest) slotOf(id common.DispatcherID) uint32 {
	h.coll.mu.Lock()
	defer h.coll.mu.Unlock()
	d, _ := h.coll.mu.dispatchers.Lookup(id)
	return d.slot
}

// entry is a ResolvedBatch entry for id at (epoch, seq) with a slot.
func entry(id common.DispatcherID, epoch, seq uint64, ts common.Ts, slot uint32) messaging.Resolved {
	return messaging.Resolved{Header: hdr(id, epoch, seq), Ts: ts, Slot: slot}
}

// TestResolvedBatchAppliesEachEntryAsAResolvedAloneWould: every entry of a
// batch gets the verdict a Resolved of its own would: an advance moves its
// checkpoint, a gap resets only its dispatcher, entries of unknown
// dispatchers or of an earlier registration are ignored and counted. A
// slot is a hint the service echoes: one that names another dispatcher, or
// none at all, still reaches the dispatcher the entry names.
func TestResolvedBatchAppliesEachEntryAsAResolvedAloneWould(t *testing.T) {
	h := newCrafted(t, nil, nil)
	d1, d2, d3, d4 := h.addAndHandshake(1, 10), h.addAndHandshake(2, 10), h.addAndHandshake(3, 10), h.addAndHandshake(4, 10)
	require.Equal(t, []uint32{1, 2, 3, 4}, []uint32{h.slotOf(d1), h.slotOf(d2), h.slotOf(d3), h.slotOf(d4)})
	stale := entry(d4, 1, 1, 40, h.slotOf(d4))
	stale.Registration++ // an earlier registration of d4
	h.deliver(&messaging.ResolvedBatch{Entries: []messaging.Resolved{
		entry(d1, 1, 1, 20, h.slotOf(d1)),
		entry(d2, 1, 1, 25, h.slotOf(d3)), // a slot naming another dispatcher
		entry(d3, 1, 5, 30, h.slotOf(d3)), // a gap: d3 resets
		entry(did(99), 1, 1, 35, 1),       // not ours, in d1's slot
		stale,
		entry(d4, 1, 1, 45, 1<<31),        // a slot out of range
		entry(d1, 1, 1, 15, h.slotOf(d1)), // behind: no effect
	}})

	require.Equal(t, common.Ts(20), h.sink.CheckpointOf(d1))
	require.Equal(t, common.Ts(25), h.sink.CheckpointOf(d2))
	require.Equal(t, common.Ts(45), h.sink.CheckpointOf(d4))
	require.Equal(t, resetCallForTest{d3, 2, 10}, h.svc.nextReset(t))
	require.Len(t, h.svc.resetCalls(), 1, "only the entry with a gap reset its dispatcher")
	require.Equal(t, common.Ts(10), h.status(d3).Checkpoint)
	require.Zero(t, h.sink.CheckpointOf(d3), "no checkpoint call for d3")
	st := h.coll.Stats()
	require.Equal(t, uint64(1), st.Resets[ResetGap])
	require.Equal(t, uint64(1), st.UnknownIgnored)
	require.Equal(t, uint64(1), st.StaleRegistrationIgnored)
	require.Equal(t, uint64(1), st.Messages[messaging.KindResolvedBatch-1])
	require.Equal(t, uint64(7), st.Messages[messaging.KindResolved-1], "each entry counts as a resolved-ts")
}

// TestInvalidResolvedBatchIsIgnored: a batch of no entries, or of more than
// messaging.MaxResolvedBatchEntries, is counted and changes nothing.
func TestInvalidResolvedBatchIsIgnored(t *testing.T) {
	h := newCrafted(t, nil, nil)
	id := h.addAndHandshake(1, 10)
	many := make([]messaging.Resolved, messaging.MaxResolvedBatchEntries+1)
	for i := range many {
		many[i] = entry(id, 1, 1, 20, 1)
	}
	h.deliver(&messaging.ResolvedBatch{}, &messaging.ResolvedBatch{Entries: many})
	require.Equal(t, uint64(2), h.coll.cnt.ignored[ignoreInvalidBatch].Load())
	require.Zero(t, h.sink.CheckpointOf(id), "no checkpoint call")
	require.Zero(t, h.coll.Stats().TotalResets())
}

// TestSlotsAreReusedAndNeverMisdirect: a removed dispatcher's slot goes to
// the next one added; an advance of the removed registration that still
// carries the slot is ignored (it names another dispatcher), and the new
// occupant's own advances arrive by slot.
func TestSlotsAreReusedAndNeverMisdirect(t *testing.T) {
	h := newCrafted(t, nil, nil)
	d1 := h.addAndHandshake(1, 10)
	old := h.slotOf(d1)
	require.NoError(t, h.coll.RemoveDispatcher(context.Background(), d1))
	d2 := h.addAndHandshake(2, 10)
	require.Equal(t, old, h.slotOf(d2), "the slot was reused")
	h.deliver(&messaging.ResolvedBatch{Entries: []messaging.Resolved{entry(d1, 1, 1, 20, old), entry(d2, 1, 1, 30, old)}})
	require.Equal(t, uint64(1), h.coll.Stats().UnknownIgnored)
	require.Equal(t, common.Ts(30), h.sink.CheckpointOf(d2))
}

// blockCheckpointSinkForTest holds the first Checkpoint call until
// released, and records every Checkpoint call's dispatcher.
type blockCheckpointSinkForTest struct {
	Sink
	entered chan struct{}
	release chan struct{}
	once    sync.Once
	mu      sync.Mutex
	calls   []common.DispatcherID
}

func (b *blockCheckpointSinkForTest) Checkpoint(id common.DispatcherID, ts common.Ts) error {
	b.mu.Lock()
	b.calls = append(b.calls, id)
	first := len(b.calls) == 1
	b.mu.Unlock()
	if first {
		close(b.entered)
		<-b.release
	}
	return b.Sink.Checkpoint(id, ts)
}

func (b *blockCheckpointSinkForTest) unblock() { b.once.Do(func() { close(b.release) }) }

func (b *blockCheckpointSinkForTest) callsOf(id common.DispatcherID) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, c := range b.calls {
		if c == id {
			n++
		}
	}
	return n
}

// TestRemoveDispatcherWaitsForABatchsSinkCalls: a batch's verdicts are
// taken under one lock and its sink calls made after; RemoveDispatcher of
// a dispatcher whose call is still to come in that batch waits until the
// batch's calls ended, so that when it returns no call for it is in
// progress or will start.
func TestRemoveDispatcherWaitsForABatchsSinkCalls(t *testing.T) {
	block := &blockCheckpointSinkForTest{entered: make(chan struct{}), release: make(chan struct{})}
	h := newCrafted(t, func(s Sink) Sink { block.Sink = s; return block }, nil)
	t.Cleanup(block.unblock)
	waiting := make(chan struct{}, 1)
	h.coll.knobs.removeWaitsForSink = func(common.DispatcherID) { waiting <- struct{}{} }
	d1, d2 := h.addAndHandshake(1, 10), h.addAndHandshake(2, 10)
	require.NoError(t, h.inproc.Send(testTarget, []messaging.Message{&messaging.ResolvedBatch{Entries: []messaging.Resolved{
		entry(d1, 1, 1, 20, h.slotOf(d1)), entry(d2, 1, 1, 20, h.slotOf(d2)),
	}}}))
	<-block.entered // d1's call is held; d2's is still to come

	removed := make(chan error, 1)
	go func() { removed <- h.coll.RemoveDispatcher(context.Background(), d2) }()
	select {
	case <-waiting:
	case err := <-removed:
		t.Fatalf("RemoveDispatcher returned (%v) before the batch's call for it", err)
	}
	block.unblock()
	require.NoError(t, <-removed)
	calls := block.callsOf(d2)
	require.Equal(t, 1, calls, "its call was made before Remove returned")
	<-h.handled
	require.Equal(t, calls, block.callsOf(d2), "and none after")
	require.Equal(t, common.Ts(20), h.sink.CheckpointOf(d1))
}

// TestHeartbeatsEchoTheHandshakesSlot: a heartbeat entry carries the slot
// the service gave the dispatcher in the handshake of its current epoch.
func TestHeartbeatsEchoTheHandshakesSlot(t *testing.T) {
	h := newCrafted(t, nil, nil)
	id := did(1)
	require.NoError(t, h.coll.AddDispatcher(context.Background(), id, common.TableSpan(1), 10))
	hs := handshake(id, 1, 10)
	hs.Slot = 9
	h.deliver(hs, resolved(id, 1, 1, 20))
	h.tick()
	require.Equal(t, heartbeatCallForTest{id, 1, 20}, <-h.svc.heartbeatCh)
	h.svc.mu.Lock()
	defer h.svc.mu.Unlock()
	require.Equal(t, []uint32{9}, h.svc.heartbeatSlot)
}

// batchingSinkForTest is a MemorySink that also confirms checkpoints in
// batches (a CheckpointBatcher), failing the entries of fail.
type batchingSinkForTest struct {
	Sink
	mu    sync.Mutex
	calls [][]SinkCheckpoint
	fail  common.DispatcherID
}

func (b *batchingSinkForTest) CheckpointBatch(cps []SinkCheckpoint, errs []error) {
	b.mu.Lock()
	b.calls = append(b.calls, append([]SinkCheckpoint(nil), cps...))
	b.mu.Unlock()
	for i, cp := range cps {
		if cp.ID == b.fail {
			errs[i] = errors.New("disk full")
			continue
		}
		errs[i] = b.Sink.Checkpoint(cp.ID, cp.Ts)
	}
}

// TestResolvedBatchCheckpointsInOneSinkCall: with a CheckpointBatcher
// sink a resolved-ts batch's checkpoints are one CheckpointBatch, and an
// entry it fails resets only its dispatcher.
func TestResolvedBatchCheckpointsInOneSinkCall(t *testing.T) {
	bs := &batchingSinkForTest{fail: did(2)}
	h := newCrafted(t, func(s Sink) Sink { bs.Sink = s; return bs }, nil)
	d1, d2, d3 := h.addAndHandshake(1, 10), h.addAndHandshake(2, 10), h.addAndHandshake(3, 10)
	h.deliver(&messaging.ResolvedBatch{Entries: []messaging.Resolved{
		entry(d1, 1, 1, 20, h.slotOf(d1)), entry(d2, 1, 1, 20, h.slotOf(d2)), entry(d3, 1, 1, 30, h.slotOf(d3)),
	}})
	bs.mu.Lock()
	require.Equal(t, [][]SinkCheckpoint{{{ID: d1, Ts: 20, Slot: h.slotOf(d1)}, {ID: d2, Ts: 20, Slot: h.slotOf(d2)}, {ID: d3, Ts: 30, Slot: h.slotOf(d3)}}},
		bs.calls, "one call for the batch, each entry with its dispatcher's slot in the collector")
	bs.mu.Unlock()
	require.Equal(t, common.Ts(20), h.status(d1).Checkpoint)
	require.Equal(t, common.Ts(30), h.status(d3).Checkpoint)
	require.Equal(t, resetCallForTest{d2, 2, 10}, h.svc.nextReset(t))
	require.Equal(t, uint64(1), h.coll.Stats().Resets[ResetSinkError])

	// A batch naming a dispatcher twice (a lying service) is called entry
	// by entry, in order.
	h.deliver(&messaging.ResolvedBatch{Entries: []messaging.Resolved{entry(d1, 1, 1, 40, 0), entry(d1, 1, 1, 50, 0)}})
	bs.mu.Lock()
	require.Len(t, bs.calls, 1, "no batch call for repeated entries")
	bs.mu.Unlock()
	require.Equal(t, common.Ts(50), h.status(d1).Checkpoint)
}

// signallingReleaserForTest reports each release on a channel (the sender
// that owns a batch's memory is the edge this test is about).
type signallingReleaserForTest struct{ released chan struct{} }

func (r signallingReleaserForTest) Release() { r.released <- struct{}{} }

// TestAnAppliedBatchIsReleasedOnce: once the collector applied a batch
// (its checkpoint moved), it releases the batch's owner, once, so the
// service may reuse the entries' memory.
func TestAnAppliedBatchIsReleasedOnce(t *testing.T) {
	h := newCrafted(t, nil, nil)
	d1 := h.addAndHandshake(1, 10)
	owner := signallingReleaserForTest{released: make(chan struct{}, 2)}
	h.deliver(messaging.NewOwnedResolvedBatch([]messaging.Resolved{entry(d1, 1, 1, 20, h.slotOf(d1))}, owner))
	require.Equal(t, common.Ts(20), h.sink.CheckpointOf(d1), "applied before its release")
	select {
	case <-owner.released:
	case <-time.After(10 * time.Second):
		t.Fatal("the applied batch was not released")
	}
	h.deliver(&messaging.ResolvedBatch{Entries: []messaging.Resolved{entry(d1, 1, 1, 30, h.slotOf(d1))}})
	require.Equal(t, common.Ts(30), h.sink.CheckpointOf(d1))
	require.Empty(t, owner.released, "released once")
}

package eventcollector

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// addAndHandshake adds dispatcher n from startTs and delivers its epoch-1
// handshake.
func (h *craftedForTest) addAndHandshake(n uint64, startTs common.Ts) common.DispatcherID {
	h.t.Helper()
	id := did(n)
	require.NoError(h.t, h.coll.AddDispatcher(context.Background(), id, common.TableSpan(int64(n)), startTs))
	h.deliver(handshake(id, 1, startTs))
	return id
}

func TestAddDispatcherRegistersEpochOneWithTarget(t *testing.T) {
	h := newCrafted(t, nil, nil)
	id := did(1)
	require.NoError(t, h.coll.AddDispatcher(context.Background(), id, common.TableSpan(1), 10))
	h.svc.mu.Lock()
	require.Equal(t, []messaging.RegisterRequest{{Dispatcher: id, Registration: craftedReg(id), Span: common.TableSpan(1), StartTs: 10, Target: testTarget, Slot: 1}}, h.svc.registers)
	h.svc.mu.Unlock()
	st := h.status(id)
	require.Equal(t, DispatcherStatus{Registration: craftedReg(id), Epoch: 1, StartTs: 10, Checkpoint: 10, Resolved: 10, LastHeartbeat: 10}, st)
}

func TestDataBeforeHandshakeResets(t *testing.T) {
	h := newCrafted(t, nil, nil)
	id := did(1)
	require.NoError(t, h.coll.AddDispatcher(context.Background(), id, common.TableSpan(1), 10))
	h.deliver(dml(id, 1, 2, false, row("a", 15, 20)))
	require.Equal(t, resetCallForTest{id, 2, 10}, h.svc.nextReset(t))
	require.Equal(t, uint64(1), h.coll.Stats().Resets[ResetBeforeHandshake])

	// The old epoch's handshake is now stale; the new one opens epoch 2.
	h.deliver(handshake(id, 1, 10))
	require.Equal(t, uint64(1), h.coll.Stats().StaleIgnored)
	h.deliver(handshake(id, 2, 10), dml(id, 2, 2, false, row("a", 15, 20)), resolved(id, 2, 2, 30))
	ep := h.sink.Epochs(id)
	require.Len(t, ep, 1)
	require.Equal(t, uint64(2), ep[0].Epoch)
	require.Equal(t, common.Ts(10), ep[0].StartTs)
	require.Equal(t, []string{"a"}, keys(ep[0].Rows))
	requireOneCheckpoint(t, ep[0], 30)
	require.Equal(t, common.Ts(30), h.status(id).Checkpoint)
	require.Len(t, h.svc.resetCalls(), 1)

	// A resolved-ts before the handshake resets as well.
	id2 := did(2)
	require.NoError(t, h.coll.AddDispatcher(context.Background(), id2, common.TableSpan(2), 5))
	h.deliver(resolved(id2, 1, 1, 8))
	require.Equal(t, resetCallForTest{id2, 2, 5}, h.svc.nextReset(t))
	require.Equal(t, uint64(2), h.coll.Stats().Resets[ResetBeforeHandshake])
}

func TestSecondHandshakeResetsFromCheckpoint(t *testing.T) {
	h := newCrafted(t, nil, nil)
	id := h.addAndHandshake(1, 10)
	h.deliver(dml(id, 1, 2, false, row("a", 15, 20)), resolved(id, 1, 2, 30), dml(id, 1, 3, false, row("b", 31, 35)))
	h.deliver(handshake(id, 1, 10))
	require.Equal(t, resetCallForTest{id, 2, 30}, h.svc.nextReset(t))
	st := h.status(id)
	require.Equal(t, uint64(2), st.Epoch)
	require.Equal(t, common.Ts(30), st.StartTs)
	require.False(t, st.Handshaked)
	require.Equal(t, uint64(1), h.coll.Stats().Resets[ResetDuplicateHandshake])

	// Leftovers of epoch 1 are ignored; epoch 2 re-delivers from 30.
	h.deliver(dml(id, 1, 4, false, row("c", 36, 40)), resolved(id, 1, 4, 50))
	require.Equal(t, uint64(2), h.coll.Stats().StaleIgnored)
	h.deliver(handshake(id, 2, 30), dml(id, 2, 2, false, row("b", 31, 35), row("c", 36, 40)), resolved(id, 2, 2, 50))
	require.Equal(t, common.Ts(50), h.sink.CheckpointOf(id))
	require.Equal(t, []string{"a", "b", "c"}, keys(h.sink.Deduplicated(id)))
	require.Equal(t, []string{"a", "b", "b", "c"}, keys(h.sink.Applied(id)), "b was re-delivered in the new epoch")
}

func TestHigherEpochResetsAboveIt(t *testing.T) {
	h := newCrafted(t, nil, nil)
	id := h.addAndHandshake(1, 10)
	h.deliver(resolved(id, 5, 3, 40))
	require.Equal(t, resetCallForTest{id, 6, 10}, h.svc.nextReset(t))
	require.Equal(t, uint64(1), h.coll.Stats().Resets[ResetEpoch])
	require.Equal(t, uint64(6), h.status(id).Epoch)
}

func TestSeqGapsReset(t *testing.T) {
	for _, tc := range []struct {
		name string
		msg  func(id common.DispatcherID) messaging.Message
	}{
		{"dml skips a seq", func(id common.DispatcherID) messaging.Message { return dml(id, 1, 4, false, row("b", 31, 35)) }},
		{"dml repeats a seq", func(id common.DispatcherID) messaging.Message { return dml(id, 1, 2, false, row("b", 31, 35)) }},
		{"ddl skips a seq", func(id common.DispatcherID) messaging.Message { return ddl(id, 1, 4, 35) }},
		{"resolved ahead", func(id common.DispatcherID) messaging.Message { return resolved(id, 1, 3, 40) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newCrafted(t, nil, nil)
			id := h.addAndHandshake(1, 10)
			h.deliver(dml(id, 1, 2, false, row("a", 15, 20)), resolved(id, 1, 2, 30))
			h.deliver(tc.msg(id))
			require.Equal(t, resetCallForTest{id, 2, 30}, h.svc.nextReset(t))
			require.Equal(t, uint64(1), h.coll.Stats().Resets[ResetGap])
		})
	}
}

func TestStaleResolvedIsIgnoredNotReset(t *testing.T) {
	h := newCrafted(t, nil, nil)
	id := h.addAndHandshake(1, 10)
	h.deliver(dml(id, 1, 2, false, row("a", 15, 20)), dml(id, 1, 3, false, row("b", 21, 25)))
	// Sent (through the resolved set) before the DML of seq 3 overtook it.
	h.deliver(resolved(id, 1, 2, 22))
	require.Equal(t, uint64(1), h.coll.Stats().StaleIgnored)
	require.Equal(t, common.Ts(10), h.status(id).Checkpoint)
	h.deliver(resolved(id, 1, 3, 30))
	require.Equal(t, common.Ts(30), h.status(id).Checkpoint)
	// A resolved-ts that does not advance is neither stale nor a reset.
	h.deliver(resolved(id, 1, 3, 30), resolved(id, 1, 3, 28))
	st := h.coll.Stats()
	require.Equal(t, uint64(1), st.StaleIgnored)
	require.Zero(t, st.TotalResets())
	require.Empty(t, h.svc.resetCalls())
	requireOneCheckpoint(t, h.sink.Epochs(id)[0], 30)
}

func TestSplitTransactionDefersCheckpoint(t *testing.T) {
	h := newCrafted(t, nil, nil)
	id := h.addAndHandshake(1, 10)
	h.deliver(dml(id, 1, 2, true, row("a", 15, 20), row("b", 25, 30)))
	// Everything below 30 is complete, but the transaction at 30 is cut.
	h.deliver(resolved(id, 1, 2, 29))
	st := h.status(id)
	require.Equal(t, common.Ts(29), st.Resolved)
	require.Equal(t, common.Ts(10), st.Checkpoint, "no checkpoint inside a split transaction")
	h.deliver(dml(id, 1, 3, false, row("c", 25, 30)), resolved(id, 1, 3, 40))
	require.Equal(t, common.Ts(40), h.status(id).Checkpoint)
	requireOneCheckpoint(t, h.sink.Epochs(id)[0], 40)
	require.Equal(t, []string{"a", "b", "c"}, keys(h.sink.Applied(id)))
	require.Zero(t, h.coll.Stats().TotalResets())
}

func TestInvalidMessagesReset(t *testing.T) {
	for _, tc := range []struct {
		name string
		msgs func(id common.DispatcherID) []messaging.Message
	}{
		{"empty dml", func(id common.DispatcherID) []messaging.Message { return []messaging.Message{dml(id, 1, 3, false)} }},
		{"row at the resolved-ts", func(id common.DispatcherID) []messaging.Message {
			return []messaging.Message{dml(id, 1, 3, false, row("b", 25, 30))}
		}},
		{"row below the last row", func(id common.DispatcherID) []messaging.Message {
			return []messaging.Message{dml(id, 1, 3, false, row("b", 31, 40)), dml(id, 1, 4, false, row("c", 31, 35))}
		}},
		{"ddl below the last row", func(id common.DispatcherID) []messaging.Message {
			return []messaging.Message{dml(id, 1, 3, false, row("b", 31, 40)), ddl(id, 1, 4, 35)}
		}},
		{"row at the last ddl", func(id common.DispatcherID) []messaging.Message {
			return []messaging.Message{ddl(id, 1, 3, 40), dml(id, 1, 4, false, row("b", 31, 40))}
		}},
		{"ddl inside a split transaction", func(id common.DispatcherID) []messaging.Message {
			return []messaging.Message{dml(id, 1, 3, true, row("b", 31, 40)), ddl(id, 1, 4, 40)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newCrafted(t, nil, nil)
			id := h.addAndHandshake(1, 10)
			h.deliver(dml(id, 1, 2, false, row("a", 15, 20)), resolved(id, 1, 2, 30))
			h.deliver(tc.msgs(id)...)
			require.Equal(t, resetCallForTest{id, 2, 30}, h.svc.nextReset(t))
			require.Equal(t, uint64(1), h.coll.Stats().Resets[ResetInvalid])
		})
	}
	t.Run("handshake above the requested start-ts", func(t *testing.T) {
		h := newCrafted(t, nil, nil)
		id := did(1)
		require.NoError(t, h.coll.AddDispatcher(context.Background(), id, common.TableSpan(1), 10))
		h.deliver(handshake(id, 1, 11))
		require.Equal(t, resetCallForTest{id, 2, 10}, h.svc.nextReset(t))
		require.Equal(t, uint64(1), h.coll.Stats().Resets[ResetInvalid])
		require.Empty(t, h.sink.Epochs(id))
	})
}

func TestUnknownDispatcherIgnored(t *testing.T) {
	h := newCrafted(t, nil, nil)
	h.deliver(handshake(did(9), 1, 10))
	st := h.coll.Stats()
	require.Equal(t, uint64(1), st.UnknownIgnored)
	require.Equal(t, uint64(1), st.Messages[messaging.KindHandshake-1])
	require.Empty(t, h.sink.Dispatchers())
}

func TestSinkErrorResetsFromCheckpoint(t *testing.T) {
	fail := &failingSinkForTest{failRowsAt: 2}
	h := newCrafted(t, func(s Sink) Sink { fail.Sink = s; return fail }, nil)
	id := h.addAndHandshake(1, 10)
	h.deliver(dml(id, 1, 2, false, row("a", 15, 20)), resolved(id, 1, 2, 30), dml(id, 1, 3, false, row("b", 31, 35)))
	require.Equal(t, resetCallForTest{id, 2, 30}, h.svc.nextReset(t))
	st := h.coll.Stats()
	require.Equal(t, uint64(1), st.Resets[ResetSinkError])
	require.Equal(t, uint64(1), st.RowsApplied)
	h.deliver(handshake(id, 2, 30), dml(id, 2, 2, false, row("b", 31, 35)), resolved(id, 2, 2, 40))
	require.Equal(t, common.Ts(40), h.sink.CheckpointOf(id))
	require.Equal(t, []string{"a", "b"}, keys(h.sink.Applied(id)))
}

// failingSinkForTest fails the failRowsAt-th ApplyRows call (1-based).
type failingSinkForTest struct {
	Sink
	failRowsAt int
	calls      int
}

var errSinkForTest = errors.New("sink failure injected by the test")

func (f *failingSinkForTest) ApplyRows(id common.DispatcherID, rows []common.Row) error {
	f.calls++
	if f.calls == f.failRowsAt {
		return errSinkForTest
	}
	return f.Sink.ApplyRows(id, rows)
}

func TestResetStaleEpochGoesAboveAndRetriesOnce(t *testing.T) {
	h := newCrafted(t, nil, nil)
	id := h.addAndHandshake(1, 10)
	stale := fmt.Errorf("%w: reset to epoch 2, current 2", messaging.ErrStaleEpoch)
	h.svc.mu.Lock()
	h.svc.resetErrs = []error{stale}
	h.svc.mu.Unlock()
	h.deliver(handshake(id, 1, 10))
	require.Equal(t, resetCallForTest{id, 2, 10}, h.svc.nextReset(t))
	require.Equal(t, resetCallForTest{id, 3, 10}, h.svc.nextReset(t))
	st := h.status(id)
	require.Equal(t, uint64(3), st.Epoch)
	require.False(t, st.PendingReset)
	require.Equal(t, uint64(1), st.Resets, "one reset, two calls")

	// Stale twice: the local epoch moves on and the next tick retries.
	h.svc.mu.Lock()
	h.svc.resetErrs = []error{stale, stale}
	h.svc.mu.Unlock()
	h.deliver(handshake(id, 2, 10)) // epoch 2 < 3: stale leftover, ignored
	h.deliver(resolved(id, 3, 1, 10))
	require.Equal(t, resetCallForTest{id, 4, 10}, h.svc.nextReset(t))
	require.Equal(t, resetCallForTest{id, 5, 10}, h.svc.nextReset(t))
	require.True(t, h.status(id).PendingReset)
	h.tick()
	require.Equal(t, resetCallForTest{id, 6, 10}, h.svc.nextReset(t))
	require.False(t, h.status(id).PendingReset)
}

func TestFailedResetIsRetriedEveryTick(t *testing.T) {
	h := newCrafted(t, nil, nil)
	id := h.addAndHandshake(1, 10)
	h.deliver(dml(id, 1, 2, false, row("a", 15, 20)), resolved(id, 1, 2, 30))
	boom := errors.New("service unavailable")
	h.svc.mu.Lock()
	h.svc.resetErrs = []error{boom, boom}
	h.svc.mu.Unlock()
	h.deliver(dml(id, 1, 4, false, row("b", 31, 35)))
	require.Equal(t, resetCallForTest{id, 2, 30}, h.svc.nextReset(t))
	require.True(t, h.status(id).PendingReset)
	require.Equal(t, 1, h.coll.Stats().PendingResets)

	h.tick() // fails again; no heartbeat for a dispatcher awaiting its reset
	require.Equal(t, resetCallForTest{id, 2, 30}, h.svc.nextReset(t))
	require.Empty(t, h.svc.heartbeatCh)
	h.tick()
	require.Equal(t, resetCallForTest{id, 2, 30}, h.svc.nextReset(t))
	require.False(t, h.status(id).PendingReset)
	h.tick()
	require.Equal(t, heartbeatCallForTest{id, 2, 30}, <-h.svc.heartbeatCh)
	require.Empty(t, h.svc.resetCh)
}

func TestHandshakeAcknowledgesAFailedReset(t *testing.T) {
	h := newCrafted(t, nil, nil)
	id := h.addAndHandshake(1, 10)
	h.svc.mu.Lock()
	h.svc.resetErrs = []error{errors.New("reported failure, but applied")}
	h.svc.mu.Unlock()
	h.deliver(handshake(id, 1, 10))
	require.Equal(t, resetCallForTest{id, 2, 10}, h.svc.nextReset(t))
	require.True(t, h.status(id).PendingReset)
	h.deliver(handshake(id, 2, 10))
	require.False(t, h.status(id).PendingReset)
	h.tick()
	require.Empty(t, h.svc.resetCh, "the handshake proved the service has the epoch")
}

func TestHeartbeatsReportAdvancedCheckpoints(t *testing.T) {
	h := newCrafted(t, nil, nil)
	a := h.addAndHandshake(1, 10)
	b := h.addAndHandshake(2, 10)
	h.tick()
	require.Empty(t, h.svc.heartbeatCh, "nothing advanced")

	h.deliver(dml(a, 1, 2, false, row("a", 15, 20)), resolved(a, 1, 2, 30))
	h.tick()
	require.Equal(t, heartbeatCallForTest{a, 1, 30}, <-h.svc.heartbeatCh)
	require.Empty(t, h.svc.heartbeatCh, "b did not advance")
	require.Equal(t, common.Ts(30), h.status(a).LastHeartbeat)
	h.tick()
	require.Empty(t, h.svc.heartbeatCh, "a was reported already")

	// A stale-epoch answer is not an acknowledgement: reported again.
	h.svc.mu.Lock()
	h.svc.heartbeatErrs = []error{fmt.Errorf("%w: heartbeat", messaging.ErrStaleEpoch)}
	h.svc.mu.Unlock()
	h.deliver(resolved(b, 1, 1, 25))
	h.tick()
	require.Equal(t, heartbeatCallForTest{b, 1, 25}, <-h.svc.heartbeatCh)
	require.Equal(t, common.Ts(10), h.status(b).LastHeartbeat)
	h.tick()
	require.Equal(t, heartbeatCallForTest{b, 1, 25}, <-h.svc.heartbeatCh)
	require.Equal(t, common.Ts(25), h.status(b).LastHeartbeat)
	require.Equal(t, uint64(2), h.coll.Stats().Heartbeats)
}

func TestRemovedDispatcherMessagesIgnored(t *testing.T) {
	h := newCrafted(t, nil, nil)
	id := h.addAndHandshake(1, 10)
	require.NoError(t, h.coll.RemoveDispatcher(context.Background(), id))
	h.deliver(dml(id, 1, 2, false, row("a", 15, 20)))
	require.Equal(t, uint64(1), h.coll.Stats().UnknownIgnored)
	require.Empty(t, h.sink.Applied(id))
	_, err := h.coll.Dispatcher(id)
	require.ErrorIs(t, err, ErrUnknownDispatcher)
	h.svc.mu.Lock()
	require.Equal(t, []messaging.RemoveRequest{{Dispatcher: id, Registration: craftedReg(id)}}, h.svc.removes)
	h.svc.mu.Unlock()
}

// TestCheckpointsIsDispatcherForMany: Checkpoints reads, for many IDs at
// once, the checkpoint Dispatcher reports, and says which are unknown.
func TestCheckpointsIsDispatcherForMany(t *testing.T) {
	h := newCrafted(t, nil, nil)
	a, b, unknown := did(1), did(2), did(3)
	require.NoError(t, h.coll.AddDispatcher(context.Background(), a, common.TableSpan(1), 10))
	require.NoError(t, h.coll.AddDispatcher(context.Background(), b, common.TableSpan(2), 5))
	h.deliver(handshake(a, 1, 10), resolved(a, 1, 1, 30), handshake(b, 1, 5))
	ids := []common.DispatcherID{b, unknown, a}
	dst := []common.Ts{99, 99, 99}
	known := make([]bool, len(ids))
	h.coll.Checkpoints(ids, dst, known)
	require.Equal(t, []bool{true, false, true}, known)
	require.Equal(t, []common.Ts{h.status(b).Checkpoint, 0, h.status(a).Checkpoint}, dst)
	require.Equal(t, common.Ts(30), dst[2])
}

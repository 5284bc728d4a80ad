package eventcollector

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// withReg returns m's header re-stamped with registration reg.
func withReg[M messaging.Message](m M, reg messaging.RegistrationID) M {
	switch v := any(m).(type) {
	case *messaging.Handshake:
		v.Registration = reg
	case *messaging.DMLBatch:
		v.Registration = reg
	case *messaging.DDL:
		v.Registration = reg
	case *messaging.Resolved:
		v.Registration = reg
	}
	return m
}

// TestLateMessagesOfAnEarlierRegistrationAreIgnored is issue 10's lost-rows
// interleaving as the collector sees it (a control-plane double, crafted
// messages through the real inbox): dispatcher 1 is removed and added
// again from 50; the new registration's handshake arrives, then a late
// DML (seq 2) and Resolved(200) of the old registration, same epoch 1.
// Without the registration in the header they would be accepted as the
// new stream's seq 2 and checkpoint 200, and the new stream's own seq 2
// would then look like a gap: rows in (50, 100] lost. With it they are
// ignored, counted, and every row of the new registration is applied once.
func TestLateMessagesOfAnEarlierRegistrationAreIgnored(t *testing.T) {
	h := newCrafted(t, nil, nil)
	regs := []messaging.RegistrationID{11, 22}
	h.coll.knobs.registration = func(common.DispatcherID) messaging.RegistrationID {
		r := regs[0]
		regs = regs[1:]
		return r
	}
	id := did(1)
	require.NoError(t, h.coll.AddDispatcher(context.Background(), id, common.TableSpan(1), 100))
	h.deliver(withReg(handshake(id, 1, 100), 11))
	require.NoError(t, h.coll.RemoveDispatcher(context.Background(), id))
	require.NoError(t, h.coll.AddDispatcher(context.Background(), id, common.TableSpan(1), 50))
	require.Equal(t, messaging.RegistrationID(22), h.status(id).Registration)

	h.deliver(withReg(handshake(id, 1, 50), 22),
		withReg(dml(id, 1, 2, false, row("c", 145, 150)), 11), // the old registration, late
		withReg(resolved(id, 1, 2, 200), 11),
		withReg(dml(id, 1, 2, false, row("a", 55, 60), row("b", 75, 80), row("c", 145, 150)), 22),
		withReg(resolved(id, 1, 2, 200), 22))

	st := h.coll.Stats()
	require.Equal(t, uint64(2), st.StaleRegistrationIgnored)
	require.Zero(t, st.TotalResets(), "an old registration's message is no protocol violation of the new one")
	require.Equal(t, common.Ts(200), h.sink.CheckpointOf(id))
	epochs := h.sink.Epochs(id)
	require.Len(t, epochs, 2, "one stream per registration")
	require.Equal(t, common.Ts(50), epochs[1].StartTs)
	require.Equal(t, []string{"a", "b", "c"}, keys(epochs[1].Rows), "every row above the new start-ts, once")
	requireOneCheckpoint(t, epochs[1], 200)
}

// TestRemoveDispatcherWaitsForItsSinkCallInFlight: RemoveDispatcher
// returns only once the sink call in progress for the dispatcher ended,
// so a caller that re-adds the ID (or hands the table to someone else)
// sees no late write of the old registration.
func TestRemoveDispatcherWaitsForItsSinkCallInFlight(t *testing.T) {
	block := &blockingSinkForTest{entered: make(chan struct{}), release: make(chan struct{})}
	h := newCrafted(t, func(s Sink) Sink { block.Sink = s; return block }, nil)
	t.Cleanup(block.unblock)
	waiting := make(chan struct{}, 1)
	h.coll.knobs.removeWaitsForSink = func(common.DispatcherID) { waiting <- struct{}{} }
	id := h.addAndHandshake(1, 10)
	require.NoError(t, h.inproc.Send(testTarget, []messaging.Message{dml(id, 1, 2, false, row("a", 15, 20))}))
	<-block.entered

	removed := make(chan error, 1)
	go func() { removed <- h.coll.RemoveDispatcher(context.Background(), id) }()
	select {
	case <-waiting:
	case err := <-removed:
		t.Fatalf("RemoveDispatcher returned (%v) while a sink call of the dispatcher was in flight", err)
	}
	block.unblock()
	require.NoError(t, <-removed)
	<-h.handled // the DML's handling ended (with the sink call)
	require.Equal(t, []string{"a"}, keys(h.sink.Applied(id)))

	// A caller that gives up waiting learns that the call still runs.
	block2 := &blockingSinkForTest{entered: make(chan struct{}), release: make(chan struct{})}
	h2 := newCrafted(t, func(s Sink) Sink { block2.Sink = s; return block2 }, nil)
	t.Cleanup(block2.unblock)
	id2 := h2.addAndHandshake(2, 10)
	require.NoError(t, h2.inproc.Send(testTarget, []messaging.Message{dml(id2, 1, 2, false, row("a", 15, 20))}))
	<-block2.entered
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := h2.coll.RemoveDispatcher(ctx, id2)
	require.ErrorIs(t, err, context.Canceled)
	_, err = h2.coll.Dispatcher(id2)
	require.ErrorIs(t, err, ErrUnknownDispatcher, "the state is dropped all the same")
}

// TestHeartbeatsAreBatched: one heartbeat call carries every dispatcher
// whose checkpoint advanced, each entry judged on its own; more than
// messaging.MaxHeartbeatCheckpoints take several calls.
func TestHeartbeatsAreBatched(t *testing.T) {
	h := newCrafted(t, nil, nil)
	const n = messaging.MaxHeartbeatCheckpoints + 5
	for i := uint64(1); i <= n; i++ {
		id := did(i)
		require.NoError(t, h.coll.AddDispatcher(context.Background(), id, common.TableSpan(int64(i)), 10))
		h.deliver(handshake(id, 1, 10), resolved(id, 1, 1, 20))
	}
	h.svc.mu.Lock()
	h.svc.heartbeatErrs = []error{messaging.ErrStaleEpoch} // the first entry: a reset is under way
	h.svc.mu.Unlock()
	reported := make(chan struct{})
	go func() {
		defer close(reported)
		for range n {
			<-h.svc.heartbeatCh
		}
	}()
	h.tick()
	<-reported
	h.svc.mu.Lock()
	require.Equal(t, 2, h.svc.heartbeatReqs, "%d checkpoints in two calls", n)
	h.svc.mu.Unlock()
	st := h.coll.Stats()
	require.Equal(t, uint64(n-1), st.Heartbeats)
	stale := 0
	for i := uint64(1); i <= n; i++ {
		if h.status(did(i)).LastHeartbeat == 10 {
			stale++
		}
	}
	require.Equal(t, 1, stale, "the refused entry is reported again at the next tick")
}

// TestAFailedHeartbeatIsReportedAgain: heartbeats carry only what
// changed and there is no periodic full round, so a report must not be
// lost with a call that failed: every checkpoint of the failed call is
// listed again and reported at the next tick, though none advanced in
// between; once accepted, a tick reports nothing.
func TestAFailedHeartbeatIsReportedAgain(t *testing.T) {
	h := newCrafted(t, nil, nil)
	ids := []common.DispatcherID{did(1), did(2), did(3)}
	for i, id := range ids {
		require.NoError(t, h.coll.AddDispatcher(context.Background(), id, common.TableSpan(int64(i+1)), 10))
		h.deliver(handshake(id, 1, 10), resolved(id, 1, 1, common.Ts(20+i)))
	}
	h.svc.mu.Lock()
	h.svc.heartbeatCallErrs = []error{messaging.ErrUnavailable}
	h.svc.mu.Unlock()
	h.tick() // the call fails
	for _, id := range ids {
		require.Equal(t, common.Ts(10), h.status(id).LastHeartbeat, "%v: nothing was accepted", id)
	}
	h.tick() // nothing advanced; the failed reports go again
	for i, id := range ids {
		require.Equal(t, common.Ts(20+i), h.status(id).LastHeartbeat, "%v: reported at the next tick", id)
	}
	h.tick() // all accepted: nothing is listed
	h.svc.mu.Lock()
	defer h.svc.mu.Unlock()
	require.Equal(t, 2, h.svc.heartbeatReqs, "the failed call, its retry, and no third")
	require.Len(t, h.svc.heartbeats, len(ids))
}

// TestHeartbeatTicksFollowChange: a heartbeat tick looks only at the
// dispatchers whose checkpoint advanced (or that have a reset or report to
// retry), never at every dispatcher: with 1000 dispatchers and one moving,
// a tick reports one checkpoint and then lists nothing.
func TestHeartbeatTicksFollowChange(t *testing.T) {
	h := newCrafted(t, nil, nil)
	for i := uint64(1); i <= 1000; i++ {
		h.addAndHandshake(i, 10)
	}
	h.tick()
	h.coll.mu.Lock()
	require.Empty(t, h.coll.mu.due, "nothing moved: nothing listed")
	h.coll.mu.Unlock()
	h.deliver(resolved(did(7), 1, 1, 20))
	h.coll.mu.Lock()
	require.Len(t, h.coll.mu.due, 1)
	h.coll.mu.Unlock()
	h.tick()
	require.Equal(t, heartbeatCallForTest{did(7), 1, 20}, <-h.svc.heartbeatCh)
	h.coll.mu.Lock()
	require.Empty(t, h.coll.mu.due, "reported: nothing listed")
	h.coll.mu.Unlock()
	require.Empty(t, h.svc.heartbeatCh)
}

package eventservice

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// holdSendForTest holds, once armed, the first Send that carries a message
// of the given kind until released, and records the order of two events
// (the held send completing, Remove returning) on a shared counter, so a
// test can assert which came first without timing.
type holdSendForTest struct {
	inner    messaging.Transport
	kind     messaging.Kind
	armed    atomic.Bool
	held     chan struct{}
	release  chan struct{}
	released sync.Once
	// order numbers events; landedAt is the held send's number.
	order    atomic.Int64
	landedAt atomic.Int64
}

func newHoldSend(kind messaging.Kind) *holdSendForTest {
	return &holdSendForTest{kind: kind, held: make(chan struct{}), release: make(chan struct{})}
}

func (h *holdSendForTest) Send(to messaging.Target, msgs []messaging.Message) error {
	if len(msgs) > 0 && msgs[0].Kind() == h.kind && h.armed.CompareAndSwap(true, false) {
		close(h.held)
		<-h.release
		err := h.inner.Send(to, msgs)
		h.landedAt.Store(h.order.Add(1))
		return err
	}
	return h.inner.Send(to, msgs)
}

func (h *holdSendForTest) unblock() { h.released.Do(func() { close(h.release) }) }

// removeHeld starts Remove of id while a send is held and checks that it
// reaches the fence and does not return: with the fence, Remove cannot
// return before the held send does; without it, it returns at once and
// the select fails the test. It then releases the send and returns
// Remove's result and when it returned, on tr's counter.
func removeHeld(t *testing.T, h *harness, tr *holdSendForTest, fencing chan struct{}, id common.DispatcherID) (error, int64) {
	t.Helper()
	type result struct {
		err error
		at  int64
	}
	removed := make(chan result, 1)
	go func() {
		err := h.remove(id)
		removed <- result{err, tr.order.Add(1)}
	}()
	select {
	case <-fencing:
	case r := <-removed:
		t.Fatalf("Remove returned (%v) while a send of the registration was held", r.err)
	}
	// While the fence waits, the ID is still taken: a new registration of
	// it is refused, not given a stream the old send could cut into.
	err := h.registerOn(id, 1, 5, testTarget)
	require.ErrorIs(t, err, messaging.ErrDispatcherExists)
	tr.unblock()
	r := <-removed
	return r.err, r.at
}

// fenceHook signals each Remove of dispatcher 1 reaching the fence.
func fenceHook(ch chan struct{}) func(*dispatcher) {
	return func(d *dispatcher) {
		if d.id == common.DispatcherIDFromUint64(1) {
			ch <- struct{}{}
		}
	}
}

// TestTableMovedBackGetsEveryRowOnce is the lost-rows interleaving of issue
// 10 as a regression test. A scan worker owns the first registration of
// dispatcher 1 (start-ts 100), has built DML(150) and Resolved(200) and is
// inside its send, held. The table moves away (Remove) and back (Register
// of the same ID from 50, a new registration). Remove waits for the held
// send (the fence), so the old registration's messages all land before it
// returns, and the new registration, whose messages carry a new identity,
// receives every row above 50 exactly once. (Before the fix Remove
// returned at once, the new registration's handshake was accepted, the old
// DML then landed at seq 2 and checkpointed 200: rows in (50, 100] were
// never delivered.)
func TestTableMovedBackGetsEveryRowOnce(t *testing.T) {
	tr := newHoldSend(messaging.KindDMLBatch)
	fencing := make(chan struct{}, 1)
	h := newHarness(t, func(o *Options) { tr.inner = o.Transport; o.Transport = tr }, hooks{beforeFence: fenceHook(fencing)})
	defer tr.unblock() // a failed run must not leave a worker held
	h.advanceSchema(1 << 40)
	// An observer from 10 keeps the table's subscription (and so its rows
	// below 100) for the registration from 50, as the upstream would.
	obs := storeObserver(t, h, 1)
	id := h.register(1, 100)
	h.check.waitResolved(id, 100)
	tr.armed.Store(true)
	h.push(1, 200, row("a", 55, 60), row("b", 75, 80), row("c", 145, 150))
	<-tr.held // the owner passed every check and is inside its send
	waitTs(obs, 200)

	err, removedAt := removeHeld(t, h, tr, fencing, id)
	require.NoError(t, err)
	require.Positive(t, tr.landedAt.Load())
	require.Less(t, tr.landedAt.Load(), removedAt, "the held send landed before Remove returned")
	old := h.check.waitResolved(id, 200)
	require.Equal(t, []string{"c"}, keys(old.rows), "the old registration got what it was sent")

	require.NoError(t, h.registerOn(id, 1, 50, testTarget)) // the table moves back, from 50
	es := h.check.waitResolved(id, 200)
	require.Equal(t, common.Ts(50), es.startTs)
	require.Equal(t, []string{"a", "b", "c"}, keys(es.rows), "every row above the new start-ts, once")
	h.check.mu.Lock()
	defer h.check.mu.Unlock()
	require.Zero(t, h.check.staleReg[id], "nothing of the removed registration arrived after Remove returned")
	require.Len(t, h.check.history[id], 2)
}

// TestRemoveWaitsForTheResolvedPumpsHeldDelivery: the target's resolved-ts
// pump is inside a delivery carrying the dispatcher's progress, held;
// Remove waits for it, so that progress lands before Remove returns and
// nothing of the registration is sent afterwards.
func TestRemoveWaitsForTheResolvedPumpsHeldDelivery(t *testing.T) {
	tr := newHoldSend(messaging.KindResolvedBatch)
	fencing := make(chan struct{}, 1)
	h := newHarness(t, func(o *Options) { tr.inner = o.Transport; o.Transport = tr }, hooks{beforeFence: fenceHook(fencing)})
	defer tr.unblock()
	h.advanceSchema(1 << 40)
	id := h.register(1, 10)
	h.check.waitResolved(id, 10)
	tr.armed.Store(true)
	h.push(1, 30) // resolved-only: the pump delivers it, and is held
	<-tr.held

	err, removedAt := removeHeld(t, h, tr, fencing, id)
	require.NoError(t, err)
	require.Less(t, tr.landedAt.Load(), removedAt, "the held delivery landed before Remove returned")
	require.NoError(t, h.registerOn(id, 1, 30, testTarget))
	h.check.waitResolved(id, 30)
	h.check.mu.Lock()
	defer h.check.mu.Unlock()
	require.Zero(t, h.check.staleReg[id], "nothing of the removed registration arrived after Remove returned")
}

// TestStaleControlRequestsChangeNothing: requests of an earlier
// registration of an ID (a late retry over a network, say) neither reset,
// remove nor checkpoint the current one.
func TestStaleControlRequestsChangeNothing(t *testing.T) {
	h := newHarness(t, nil, hooks{})
	h.advanceSchema(1 << 40)
	id := h.register(1, 10)
	first := h.regOf(id)
	require.NoError(t, h.remove(id))
	require.NoError(t, h.registerOn(id, 1, 10, testTarget))
	h.push(1, 40, row("a", 15, 20))
	h.check.waitResolved(id, 40)

	ctx := context.Background()
	require.ErrorIs(t, h.svc.Reset(ctx, messaging.ResetRequest{Dispatcher: id, Registration: first, Epoch: 2, StartTs: 10}),
		messaging.ErrStaleRegistration)
	require.ErrorIs(t, h.svc.Remove(ctx, messaging.RemoveRequest{Dispatcher: id, Registration: first}), messaging.ErrStaleRegistration)
	reply, err := h.svc.Heartbeat(ctx, messaging.HeartbeatRequest{Checkpoints: []messaging.DispatcherCheckpoint{
		{Dispatcher: id, Registration: first, Epoch: 1, Ts: 40}}})
	require.NoError(t, err)
	require.Equal(t, []messaging.Code{messaging.CodeStaleRegistration}, reply.Codes)
	snap, err := h.svc.Inspect(id)
	require.NoError(t, err)
	require.Equal(t, h.regOf(id), snap.Registration)
	require.Equal(t, uint64(1), snap.Epoch)
	require.Equal(t, common.Ts(10), snap.Checkpoint, "the stale heartbeat moved nothing")
}

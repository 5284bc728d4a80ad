package eventcollector

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// TestAddDispatchersRegistersInBatches: many dispatchers take one
// RegisterBatch call per messaging.MaxRegisterBatch; an entry the service
// refuses (asked again alone, it fails with the service's own error, which
// says why), a duplicate and an invalid spec fail alone and leave no
// state, every other dispatcher is added with its slot and takes messages.
func TestAddDispatchersRegistersInBatches(t *testing.T) {
	h := newCrafted(t, nil, nil)
	const n = messaging.MaxRegisterBatch + 10
	refused := did(7)
	h.svc.refuseEntry = func(r messaging.RegisterRequest) bool { return r.Dispatcher == refused }
	specs := make([]DispatcherSpec, 0, n+2)
	for i := uint64(1); i <= n; i++ {
		specs = append(specs, DispatcherSpec{ID: did(i), Span: common.TableSpan(int64(i)), StartTs: 10})
	}
	specs = append(specs, DispatcherSpec{ID: did(3), Span: common.TableSpan(3), StartTs: 10}) // a duplicate
	specs = append(specs, DispatcherSpec{Span: common.TableSpan(1)})                          // no ID
	errs := h.coll.AddDispatchers(context.Background(), specs)
	for i, err := range errs {
		switch {
		case specs[i].ID == refused:
			require.ErrorIs(t, err, messaging.ErrLimitExceeded)
			require.ErrorContains(t, err, "the test's service refuses", "the service's own error, asked alone")
		case i == n:
			require.ErrorIs(t, err, ErrDispatcherExists)
		case i == n+1:
			require.ErrorIs(t, err, ErrInvalidArgument)
		default:
			require.NoError(t, err, "spec %d", i)
		}
	}
	h.svc.mu.Lock()
	require.Equal(t, []int{messaging.MaxRegisterBatch, 10}, h.svc.batches, "one call per batch, without the entries refused before it")
	h.svc.mu.Unlock()
	_, err := h.coll.Dispatcher(refused)
	require.ErrorIs(t, err, ErrUnknownDispatcher, "a refused entry leaves no state")
	require.Equal(t, n-1, h.coll.Stats().Dispatchers)

	id := did(n)
	h.deliver(handshake(id, 1, 10), &messaging.ResolvedBatch{Entries: []messaging.Resolved{entry(id, 1, 1, 20, h.slotOf(id))}})
	require.Equal(t, common.Ts(20), h.sink.CheckpointOf(id))
	h.deliver(handshake(refused, 1, 10))
	require.Equal(t, uint64(1), h.coll.Stats().UnknownIgnored)
}

// TestForgetDispatchersDropsStateWithoutAControlCall: a collector with
// TakeOver forgets dispatchers without a Remove call to the service (a
// reconnect re-registers them in batches instead); their later messages
// are ignored, the IDs can be added again with a new registration that
// asks the service to take the old one over, and an ID it does not hold
// fails alone. Without TakeOver every entry is refused and nothing is
// dropped.
func TestForgetDispatchersDropsStateWithoutAControlCall(t *testing.T) {
	h := newCrafted(t, nil, func(o *Options) { o.TakeOver = true })
	a, b := h.addAndHandshake(1, 10), h.addAndHandshake(2, 10)
	errs := h.coll.ForgetDispatchers(context.Background(), []common.DispatcherID{a, did(9), b, a})
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], ErrUnknownDispatcher)
	require.NoError(t, errs[2])
	require.ErrorIs(t, errs[3], ErrUnknownDispatcher, "named twice: the second finds it gone")
	h.svc.mu.Lock()
	require.Empty(t, h.svc.removes, "no control call per dispatcher")
	h.svc.mu.Unlock()
	_, err := h.coll.Dispatcher(a)
	require.ErrorIs(t, err, ErrUnknownDispatcher)

	// A message of the forgotten registration is ignored.
	h.deliver(resolved(a, 1, 1, 20))
	require.Zero(t, h.sink.CheckpointOf(a))

	for _, err := range h.coll.AddDispatchers(context.Background(), []DispatcherSpec{
		{ID: a, Span: common.TableSpan(1), StartTs: 10}, {ID: b, Span: common.TableSpan(2), StartTs: 10}}) {
		require.NoError(t, err)
	}
	h.svc.mu.Lock()
	var asked []messaging.RegisterRequest
	for _, r := range h.svc.registers {
		if r.Dispatcher == a {
			asked = append(asked, r)
		}
	}
	h.svc.mu.Unlock()
	require.Len(t, asked, 2, "registered again")
	require.True(t, asked[1].Replace, "the new registration takes the service's old one over")
	_, err = h.coll.Dispatcher(a)
	require.NoError(t, err)

	plain := newCrafted(t, nil, nil)
	c := plain.addAndHandshake(3, 10)
	errs = plain.coll.ForgetDispatchers(context.Background(), []common.DispatcherID{c})
	require.ErrorIs(t, errs[0], ErrInvalidArgument)
	_, err = plain.coll.Dispatcher(c)
	require.NoError(t, err, "refused: nothing dropped")
}

// TestForgetDispatchersWaitsForASinkCallInFlight: like RemoveDispatcher,
// ForgetDispatchers returns only once the sink call in progress for a
// forgotten dispatcher ended (so the re-added registration sees no late
// write of the old one); a caller that gives up waiting gets the
// context's error for that entry alone, and the state is dropped all the
// same.
func TestForgetDispatchersWaitsForASinkCallInFlight(t *testing.T) {
	block := &blockingSinkForTest{entered: make(chan struct{}), release: make(chan struct{})}
	h := newCrafted(t, func(s Sink) Sink { block.Sink = s; return block }, func(o *Options) { o.TakeOver = true })
	t.Cleanup(block.unblock)
	waiting := make(chan struct{}, 1)
	h.coll.knobs.removeWaitsForSink = func(common.DispatcherID) { waiting <- struct{}{} }
	busy, idle := h.addAndHandshake(1, 10), h.addAndHandshake(2, 10)
	require.NoError(t, h.inproc.Send(testTarget, []messaging.Message{dml(busy, 1, 2, false, row("a", 15, 20))}))
	<-block.entered

	done := make(chan []error, 1)
	go func() { done <- h.coll.ForgetDispatchers(context.Background(), []common.DispatcherID{idle, busy}) }()
	select {
	case <-waiting:
	case errs := <-done:
		t.Fatalf("ForgetDispatchers returned (%v) while a sink call of a dispatcher was in flight", errs)
	}
	block.unblock()
	require.Equal(t, []error{nil, nil}, <-done)
	<-h.handled // the DML's handling ended (with the sink call)

	block2 := &blockingSinkForTest{entered: make(chan struct{}), release: make(chan struct{})}
	h2 := newCrafted(t, func(s Sink) Sink { block2.Sink = s; return block2 }, func(o *Options) { o.TakeOver = true })
	t.Cleanup(block2.unblock)
	busy2, idle2 := h2.addAndHandshake(1, 10), h2.addAndHandshake(2, 10)
	require.NoError(t, h2.inproc.Send(testTarget, []messaging.Message{dml(busy2, 1, 2, false, row("a", 15, 20))}))
	<-block2.entered
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	errs := h2.coll.ForgetDispatchers(ctx, []common.DispatcherID{busy2, idle2})
	require.ErrorIs(t, errs[0], context.Canceled)
	require.NoError(t, errs[1], "the entry without a sink call in flight is done")
	_, err := h2.coll.Dispatcher(busy2)
	require.ErrorIs(t, err, ErrUnknownDispatcher, "the state is dropped all the same")
}

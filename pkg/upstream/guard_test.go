package upstream

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
)

// TestPushResolvedHoldsEveryGuardForTheCall: a guard closed before the call
// gets ErrSubscriptionClosed and its sink is not called; the others get
// the advance. A Close during the call cancels it through the cancel
// function and returns only after the call ended (the guard was held for
// all of it); the other guards see context.Canceled without being closed.
// TestResolvedPusherReusesItsBuffersWithoutCarryingResults: a pusher kept
// across calls (as the generator keeps one) gives each call the errors of
// its own guards, whatever the call before held: a longer call, then a
// shorter one with a closed guard, then one whose sink fails.
func TestResolvedPusherReusesItsBuffersWithoutCarryingResults(t *testing.T) {
	sinks := []*recordingSinkForTest{newRecordingSinkForTest(), newRecordingSinkForTest(), newRecordingSinkForTest()}
	guards := make([]*SinkGuard, len(sinks))
	for i, s := range sinks {
		guards[i] = NewSinkGuard(s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var p ResolvedPusher
	errs := make([]error, 3)
	p.Push(ctx, cancel, guards, 10, errs)
	require.Equal(t, []error{nil, nil, nil}, errs)

	require.True(t, guards[0].Close())
	errs = []error{errors.New("stale"), errors.New("stale")}
	p.Push(ctx, cancel, guards[:2], 20, errs)
	require.ErrorIs(t, errs[0], ErrSubscriptionClosed)
	require.NoError(t, errs[1])

	boom := errors.New("boom")
	sinks[2].pushHook = func(context.Context, eventstore.Batch) error { return boom }
	errs = []error{errors.New("stale"), errors.New("stale")}
	p.Push(ctx, cancel, guards[1:], 30, errs)
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], boom)
	require.Equal(t, []eventstore.Batch{{ResolvedTs: 10}, {ResolvedTs: 20}, {ResolvedTs: 30}}, sinks[1].batches())
	require.Equal(t, []eventstore.Batch{{ResolvedTs: 10}}, sinks[0].batches())
}

func TestPushResolvedHoldsEveryGuardForTheCall(t *testing.T) {
	sinks := []*recordingSinkForTest{newRecordingSinkForTest(), newRecordingSinkForTest(), newRecordingSinkForTest()}
	guards := make([]*SinkGuard, len(sinks))
	for i, s := range sinks {
		guards[i] = NewSinkGuard(s)
	}
	require.True(t, guards[1].Close())
	ctx, cancel := context.WithCancel(context.Background())
	errs := make([]error, len(guards))
	PushResolved(ctx, cancel, guards, 20, errs)
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], ErrSubscriptionClosed)
	require.NoError(t, errs[2])
	require.Equal(t, []eventstore.Batch{{ResolvedTs: 20}}, sinks[0].batches())
	require.Empty(t, sinks[1].batches())

	// Sink 0 blocks until its context ends; guard 2 is closed meanwhile.
	entered, closeDone := make(chan struct{}), make(chan struct{})
	closedFirst := make(chan bool, 1)
	sinks[0].pushHook = func(ctx context.Context, b eventstore.Batch) error {
		close(entered)
		<-ctx.Done()
		select {
		case <-closeDone:
			closedFirst <- true
		default:
			closedFirst <- false
		}
		return ctx.Err()
	}
	go func() {
		<-entered
		guards[2].Close()
		close(closeDone)
	}()
	open := []*SinkGuard{guards[0], guards[2]}
	PushResolved(ctx, cancel, open, 30, errs[:2])
	<-closeDone
	require.False(t, <-closedFirst, "Close returned while the call held its guard")
	require.ErrorIs(t, errs[0], context.Canceled)
	require.False(t, guards[0].IsClosed(), "only the closed guard is closed")
	require.True(t, guards[2].IsClosed())
	require.Panics(t, func() { PushResolved(context.Background(), func() {}, open, 40, errs[:1]) })
}

// TestGeneratorBatchedAdvanceSurvivesAnotherSubscriptionsClose: with only
// resolved-ts advances due (no rows in range), the generator pushes its
// subscriptions' advances in one PushResolved call. Closing one of them
// while another's sink blocks cancels the whole call; the closed one is
// dropped, the cancelled one is not: it gets the next advance.
func TestGeneratorBatchedAdvanceSurvivesAnotherSubscriptionsClose(t *testing.T) {
	clk := clock.NewFake(t0.Add(200 * time.Millisecond))
	o := feedOptions(clk)
	o.Tables, o.RowsPerSec = 100_000, 1 // no rows in these few ticks
	g := newTestGenerator(t, o)
	w := watchPasses(g)
	slow, entered, _ := holdOnceSinkForTest(func(eventstore.Batch) bool { return true })
	other := newRecordingSinkForTest()
	_, err := g.Subscribe(common.TableSpan(1), 0, slow)
	require.NoError(t, err)
	otherSub, err := g.Subscribe(common.TableSpan(2), 0, other)
	require.NoError(t, err)
	require.NoError(t, g.Start())
	<-entered
	otherSub.Close() // cancels the call the slow sink blocks in

	clk.Advance(50 * time.Millisecond)
	f := frontierAt(clk.Now(), testTick)
	slow.waitResolved(t, f)
	w.waitIdle(t, 0, f)
	require.Empty(t, slow.rows(), "advances only: the batched path")
	st := g.Stats()
	require.Len(t, st.Subscriptions, 1)
	require.Equal(t, common.TableSpan(1), st.Subscriptions[0].Span)
	require.Zero(t, st.PushErrors, "a cancellation is not a push error")
}

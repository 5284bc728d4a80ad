package eventstore

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// guardSinkForTest records the batches its Push accepts; pushHook, if set
// (before use), runs first, and an error from it refuses the batch.
type guardSinkForTest struct {
	pushHook func(ctx context.Context, b Batch) error
	mu       struct {
		sync.Mutex
		batches []Batch
	}
}

func (s *guardSinkForTest) Push(ctx context.Context, b Batch) error {
	if s.pushHook != nil {
		if err := s.pushHook(ctx, b); err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.batches = append(s.mu.batches, b)
	return nil
}

func (s *guardSinkForTest) batches() []Batch {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.mu.batches)
}

// TestSinkGuardRefusesAfterClose: a guard (made by NewSinkGuard, or a zero
// one held by value and Init) passes pushes to its sink until Close, which
// reports whether it was the call that closed it; after it, Push returns
// ErrSubscriptionClosed without calling the sink. A Close during a push
// cancels it through the pusher's cancel function and returns after it.
func TestSinkGuardRefusesAfterClose(t *testing.T) {
	var byValue struct{ g SinkGuard }
	sink := &guardSinkForTest{}
	byValue.g.Init(sink)
	for _, g := range []*SinkGuard{NewSinkGuard(sink), &byValue.g} {
		require.False(t, g.IsClosed())
		require.NoError(t, g.Push(context.Background(), func() {}, Batch{ResolvedTs: 5}))
		require.True(t, g.Close())
		require.True(t, g.IsClosed())
		require.False(t, g.Close(), "closed once")
		require.ErrorIs(t, g.Push(context.Background(), func() {}, Batch{ResolvedTs: 6}), ErrSubscriptionClosed)
	}
	require.Equal(t, []Batch{{ResolvedTs: 5}, {ResolvedTs: 5}}, sink.batches())

	entered := make(chan struct{})
	var returned atomic.Bool
	blocking := &guardSinkForTest{pushHook: func(ctx context.Context, _ Batch) error {
		close(entered)
		<-ctx.Done()
		returned.Store(true)
		return ctx.Err()
	}}
	g := NewSinkGuard(blocking)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pushed := make(chan error, 1)
	go func() { pushed <- g.Push(ctx, cancel, Batch{ResolvedTs: 7}) }()
	<-entered
	require.True(t, g.Close())
	require.True(t, returned.Load(), "Close returned while the push was in flight")
	require.ErrorIs(t, <-pushed, context.Canceled)
}

// TestResolvedPusherReusesItsBuffersWithoutCarryingResults: a pusher kept
// across calls (as the generator keeps one) gives each call the errors of
// its own guards, whatever the call before held: a longer call, then a
// shorter one with a closed guard, then one whose sink fails.
func TestResolvedPusherReusesItsBuffersWithoutCarryingResults(t *testing.T) {
	sinks := []*guardSinkForTest{{}, {}, {}}
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
	sinks[2].pushHook = func(context.Context, Batch) error { return boom }
	errs = []error{errors.New("stale"), errors.New("stale")}
	p.Push(ctx, cancel, guards[1:], 30, errs)
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], boom)
	require.Equal(t, []Batch{{ResolvedTs: 10}, {ResolvedTs: 20}, {ResolvedTs: 30}}, sinks[1].batches())
	require.Equal(t, []Batch{{ResolvedTs: 10}}, sinks[0].batches())
}

// TestPushResolvedGuardedHoldsEveryGuardForTheCall: a guard closed before
// the call gets ErrSubscriptionClosed and its sink is not called; the others get
// the advance. A Close during the call cancels it through the cancel
// function and returns only after the call ended (the guard was held for
// all of it); the other guards see context.Canceled without being closed.
func TestPushResolvedGuardedHoldsEveryGuardForTheCall(t *testing.T) {
	sinks := []*guardSinkForTest{{}, {}, {}}
	guards := make([]*SinkGuard, len(sinks))
	for i, s := range sinks {
		guards[i] = NewSinkGuard(s)
	}
	require.True(t, guards[1].Close())
	ctx, cancel := context.WithCancel(context.Background())
	errs := make([]error, len(guards))
	PushResolvedGuarded(ctx, cancel, guards, 20, errs)
	require.NoError(t, errs[0])
	require.ErrorIs(t, errs[1], ErrSubscriptionClosed)
	require.NoError(t, errs[2])
	require.Equal(t, []Batch{{ResolvedTs: 20}}, sinks[0].batches())
	require.Empty(t, sinks[1].batches())

	// Sink 0 blocks until its context ends; guard 2 is closed meanwhile.
	entered, closeDone := make(chan struct{}), make(chan struct{})
	closedFirst := make(chan bool, 1)
	sinks[0].pushHook = func(ctx context.Context, b Batch) error {
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
	PushResolvedGuarded(ctx, cancel, open, 30, errs[:2])
	<-closeDone
	require.False(t, <-closedFirst, "Close returned while the call held its guard")
	require.ErrorIs(t, errs[0], context.Canceled)
	require.False(t, guards[0].IsClosed(), "only the closed guard is closed")
	require.True(t, guards[2].IsClosed())
	require.Panics(t, func() { PushResolvedGuarded(context.Background(), func() {}, open, 40, errs[:1]) })
}

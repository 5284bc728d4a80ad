package eventstore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/touchahead"
	"github.com/cdcflow/eventservice/pkg/common"
)

// countingSinkForTest is a Sink of another upstream's making: PushResolved
// must call its Push.
type countingSinkForTest struct{ pushes []Batch }

func (c *countingSinkForTest) Push(_ context.Context, b Batch) error {
	c.pushes = append(c.pushes, b)
	return nil
}

// TestPushResolvedAdvancesManySubscriptionsInOneCall: every subscription of
// the call (of both write workers) advances and notifies; per sink, an
// equal ts is a no-op, a lower one ErrResolvedTsRegressed and an ended
// subscription ErrClosed, without holding back the others; rows at or
// below the ts are refused afterwards, as after a Push; a foreign sink gets
// its Push.
func TestPushResolvedAdvancesManySubscriptionsInOneCall(t *testing.T) {
	env := newTestEnv(t, nil)
	const n = 8
	recs := make([]*recorder, n)
	sinks := make([]Sink, 0, n+1)
	workers := map[int]bool{}
	for i := range n {
		recs[i] = newRecorder()
		require.NoError(t, env.store.RegisterDispatcher(did(uint64(i+1)), common.TableSpan(int64(i+1)), 0, recs[i]))
		k := env.up.last(t, common.TableSpan(int64(i+1))).sink
		sinks = append(sinks, k)
		workers[(*subscription)(k.(*sink)).worker()] = true
	}
	require.Len(t, workers, 2, "the subscriptions span both write workers")
	foreign := &countingSinkForTest{}
	sinks = append(sinks, foreign)
	errs := make([]error, len(sinks))

	PushResolved(context.Background(), sinks, 20, errs)
	for i := range n {
		require.NoError(t, errs[i])
		recs[i].waitResolved(t, 20)
	}
	require.NoError(t, errs[n])
	require.Equal(t, []Batch{{ResolvedTs: 20}}, foreign.pushes)

	// Again at 20: nothing to do. Sink 0 is moved to 30 alone first, so
	// 25 regresses it and advances the others.
	PushResolved(context.Background(), sinks[:n], 20, errs[:n])
	require.Equal(t, make([]error, n), errs[:n])
	push(t, env.up.last(t, common.TableSpan(1)), 30)
	recs[0].waitResolved(t, 30)
	PushResolved(context.Background(), sinks[:n], 25, errs[:n])
	require.ErrorIs(t, errs[0], ErrResolvedTsRegressed)
	for i := 1; i < n; i++ {
		require.NoError(t, errs[i])
		recs[i].waitResolved(t, 25)
	}
	// A row at or below the pushed resolved-ts is refused, one above kept.
	err := sinks[1].Push(context.Background(), Batch{Rows: []common.Row{put("a", 20, 25)}})
	require.ErrorIs(t, err, ErrRowBeforeResolved)
	require.NoError(t, sinks[1].Push(context.Background(), Batch{Rows: []common.Row{put("a", 20, 26)}, ResolvedTs: 26}))
	recs[1].waitResolved(t, 26)

	// An ended subscription.
	require.NoError(t, env.store.UnregisterDispatcher(did(3)))
	env.clk.Advance(2 * env.store.opts.IdleTTL)
	env.store.maintain()
	require.True(t, env.up.last(t, common.TableSpan(3)).isClosed())
	PushResolved(context.Background(), sinks[:n], 40, errs[:n])
	require.ErrorIs(t, errs[2], ErrClosed)
	require.NoError(t, errs[3])
	recs[3].waitResolved(t, 40)

	require.Panics(t, func() { PushResolved(context.Background(), sinks, 50, errs[:1]) })
}

// TestPushResolvedThatCannotQueueKeepsTheResolvedTs: with the write
// worker held and its queue full, a PushResolved whose context ends gets
// the context's error for the sinks of that worker, and their pushed
// resolved-ts stays where it was: rows above it are still accepted, and
// the same advance succeeds once the worker moves.
func TestPushResolvedThatCannotQueueKeepsTheResolvedTs(t *testing.T) {
	hold, held := make(chan struct{}), make(chan struct{}, 1)
	env := newTestEnv(t, func(o *Options) { o.WriteWorkers, o.WriteQueueSize = 1, 1 }, func(s *Store) {
		s.knobs.published = func(ts common.Ts) {
			if ts == 5 {
				held <- struct{}{}
				<-hold
			}
		}
	})
	r1, r2 := newRecorder(), newRecorder()
	require.NoError(t, env.store.RegisterDispatcher(did(1), common.TableSpan(1), 0, r1))
	require.NoError(t, env.store.RegisterDispatcher(did(2), common.TableSpan(2), 0, r2))
	s1, s2 := env.up.last(t, common.TableSpan(1)).sink, env.up.last(t, common.TableSpan(2)).sink
	push(t, env.up.last(t, common.TableSpan(1)), 5)
	<-held                                                                  // the worker is inside the publish of 5
	require.NoError(t, s2.Push(context.Background(), Batch{ResolvedTs: 6})) // fills the queue of one
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	errs := make([]error, 2)
	PushResolved(ctx, []Sink{s1, s2}, 10, errs)
	require.ErrorIs(t, errs[0], context.Canceled)
	require.ErrorIs(t, errs[1], context.Canceled)
	close(hold)
	r1.waitResolved(t, 5)
	r2.waitResolved(t, 6)
	// Not reserved: a row at 8 is still accepted for both.
	for _, k := range []Sink{s1, s2} {
		require.NoError(t, k.Push(context.Background(), Batch{Rows: []common.Row{put("a", 7, 8)}}))
	}
	PushResolved(context.Background(), []Sink{s1, s2}, 10, errs)
	require.NoError(t, errors.Join(errs...))
	r1.waitResolved(t, 10)
	r2.waitResolved(t, 10)
}

// TestPushResolvedWaitsForRoomInAdvances: the advances queued per worker
// are bounded like pushes (WriteQueueSize of them, not of events). With
// the worker publishing an event of two advances and the queue itself
// empty, a third advance waits for room (the hook proves it waits while
// the queue has space) and goes through once the event is published.
func TestPushResolvedWaitsForRoomInAdvances(t *testing.T) {
	hold, held, waiting := make(chan struct{}), make(chan struct{}), make(chan struct{})
	var once, waitOnce sync.Once
	env := newTestEnv(t, func(o *Options) { o.WriteWorkers, o.WriteQueueSize = 1, 2 }, func(s *Store) {
		s.knobs.published = func(ts common.Ts) {
			if ts == 5 {
				once.Do(func() {
					close(held)
					<-hold
				})
			}
		}
		s.knobs.advanceWaits = func() { waitOnce.Do(func() { close(waiting) }) }
	})
	recs := make([]*recorder, 3)
	sinks := make([]Sink, 3)
	for i := range recs {
		recs[i] = newRecorder()
		require.NoError(t, env.store.RegisterDispatcher(did(uint64(i+1)), common.TableSpan(int64(i+1)), 0, recs[i]))
		sinks[i] = env.up.last(t, common.TableSpan(int64(i+1))).sink
	}
	var release sync.Once
	unhold := func() { release.Do(func() { close(hold) }) }
	t.Cleanup(unhold) // before the store's Close, on any failure
	errs := make([]error, 3)
	PushResolved(context.Background(), sinks[:2], 5, errs[:2])
	require.NoError(t, errors.Join(errs[:2]...))
	<-held // the worker took the event and is publishing it: the queue is empty, the room is not
	done := make(chan struct{})
	go func() {
		defer close(done)
		PushResolved(context.Background(), sinks[2:], 6, errs[2:])
	}()
	select {
	case <-waiting:
	case <-done:
		t.Fatal("a third advance was queued with the room taken")
	}
	unhold()
	<-done
	require.NoError(t, errs[2])
	recs[0].waitResolved(t, 5)
	recs[1].waitResolved(t, 5)
	recs[2].waitResolved(t, 6)
}

// touchingRecorderForTest is a recorder that also implements TouchAheader
// and notes, per notification, whether TouchAhead came before it.
type touchingRecorderForTest struct {
	*recorder
	touched   atomic.Int64
	untouched atomic.Int64 // notifications with no TouchAhead since the last
}

func (r *touchingRecorderForTest) TouchAhead() { r.touched.Add(1) }

func (r *touchingRecorderForTest) Notify(resolved, maxCommit common.Ts) {
	if r.touched.Swap(0) == 0 {
		r.untouched.Add(1)
	}
	r.recorder.Notify(resolved, maxCommit)
}

// TestPushResolvedTouchesNotifiersAhead: an advance of many subscriptions
// (several touch-ahead chunks) notifies each dispatcher once, in full, and
// each notification of a TouchAheader comes after its TouchAhead
// (internal/touchahead); a plain Notifier is notified as before.
func TestPushResolvedTouchesNotifiersAhead(t *testing.T) {
	env := newTestEnv(t, nil)
	const n = 3*touchahead.Chunk + 7
	touching := make([]*touchingRecorderForTest, n)
	sinks := make([]Sink, 0, n+1)
	for i := range n {
		touching[i] = &touchingRecorderForTest{recorder: newRecorder()}
		require.NoError(t, env.store.RegisterDispatcher(did(uint64(i+1)), common.TableSpan(int64(i+1)), 0, touching[i]))
		sinks = append(sinks, env.up.last(t, common.TableSpan(int64(i+1))).sink)
	}
	plain := newRecorder()
	require.NoError(t, env.store.RegisterDispatcher(did(n+1), common.TableSpan(n+1), 0, plain))
	sinks = append(sinks, env.up.last(t, common.TableSpan(n+1)).sink)
	errs := make([]error, len(sinks))
	for _, ts := range []common.Ts{20, 30} {
		PushResolved(context.Background(), sinks, ts, errs)
		require.Equal(t, make([]error, len(sinks)), errs)
		for i, r := range touching {
			require.Equal(t, ts, r.waitResolved(t, ts).resolved, "dispatcher %d", i+1)
		}
		require.Equal(t, ts, plain.waitResolved(t, ts).resolved)
	}
	for i, r := range touching {
		require.Zero(t, r.untouched.Load(), "dispatcher %d notified without a touch ahead", i+1)
		require.Empty(t, r.ch, "dispatcher %d notified more than once", i+1)
	}
}

// TestPushResolvedReusesAChunkOnlyAfterItsPublish: a chunk's buffer comes
// back to the store's pool only once its worker published it. With the
// worker held inside a publish, two calls queue a chunk each; had a
// chunk's buffer been given back (emptied) at its enqueue, the worker
// would find it empty or refilled by the next call, and the first call's
// subscriptions would never advance.
func TestPushResolvedReusesAChunkOnlyAfterItsPublish(t *testing.T) {
	hold, held := make(chan struct{}), make(chan struct{}, 1)
	env := newTestEnv(t, func(o *Options) { o.WriteWorkers, o.WriteQueueSize = 1, 8 }, func(s *Store) {
		s.knobs.published = func(ts common.Ts) {
			if ts == 5 {
				held <- struct{}{}
				<-hold
			}
		}
	})
	const n = 5
	recs := make([]*recorder, n)
	sinks := make([]Sink, n)
	for i := range n {
		recs[i] = newRecorder()
		require.NoError(t, env.store.RegisterDispatcher(did(uint64(i+1)), common.TableSpan(int64(i+1)), 0, recs[i]))
		sinks[i] = env.up.last(t, common.TableSpan(int64(i+1))).sink
	}
	push(t, env.up.last(t, common.TableSpan(5)), 5)
	<-held // the worker is inside the publish of 5
	errs := make([]error, 2)
	PushResolved(context.Background(), sinks[0:2], 10, errs)
	require.NoError(t, errors.Join(errs...))
	PushResolved(context.Background(), sinks[2:4], 10, errs)
	require.NoError(t, errors.Join(errs...))
	close(hold)
	for i := range 4 {
		recs[i].waitResolved(t, 10)
	}
}

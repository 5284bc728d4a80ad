package upstream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
)

const testTick = 10 * time.Millisecond

// feedOptions: 3 tables of 20 rows per tick each (10 two-row transactions),
// pushed in chunks of 7 rows.
func feedOptions(clk clock.Clock) GeneratorOptions {
	return GeneratorOptions{
		Tables: 3, RowsPerSec: 6000, TxnRows: 2, RowBytes: 8, TxnsPerCommitTs: 3,
		KeysPerTable: 1000, Seed: 9, PushRowsMax: 7,
		StartTs: common.TsFromTime(t0), Clock: clk,
	}
}

// requireFeed checks that sink received exactly want, in batches of at most
// max rows, that resolved-ts values only grow and the last is f, and that in
// the first catch-up (up to the first resolved-ts) every batch but the last
// is full.
func requireFeed(t *testing.T, sink *recordingSinkForTest, want []common.Row, f common.Ts, max int) {
	t.Helper()
	batches := sink.batches()
	require.Equal(t, want, sink.rows())
	var last common.Ts
	firstResolved := -1
	for i, b := range batches {
		require.LessOrEqual(t, len(b.Rows), max, "batch %d", i)
		if b.ResolvedTs != 0 {
			require.Greater(t, b.ResolvedTs, last, "batch %d", i)
			last = b.ResolvedTs
			if firstResolved < 0 {
				firstResolved = i
			}
		}
		for _, r := range b.Rows {
			require.LessOrEqual(t, r.CommitTs, f)
		}
	}
	require.Equal(t, f, last)
	for i := range firstResolved {
		require.Len(t, batches[i].Rows, max, "catch-up batch %d is not full", i)
	}
}

func TestGeneratorFeedsExactRowsInChunks(t *testing.T) {
	clock := clock.NewFake(t0.Add(time.Second + 5*time.Millisecond))
	g := newTestGenerator(t, feedOptions(clock))
	whole, partial, other := newRecordingSinkForTest(), newRecordingSinkForTest(), newRecordingSinkForTest()
	startTs := tsAt(300, 1)
	span := common.Span{TableID: 2, StartKey: be64(200), EndKey: be64(600)}
	_, err := g.Subscribe(common.TableSpan(1), startTs, whole)
	require.NoError(t, err)
	_, err = g.Subscribe(span, startTs, partial)
	require.NoError(t, err)
	// A start-ts below the workload's StartTs catches up from StartTs.
	_, err = g.Subscribe(common.TableSpan(3), 1, other)
	require.NoError(t, err)
	require.Zero(t, whole.calls.Load()+partial.calls.Load()+other.calls.Load(), "Subscribe called the sink")
	require.NoError(t, g.Start())

	f := frontierAt(clock.Now(), testTick)
	for _, s := range []*recordingSinkForTest{whole, partial, other} {
		s.waitResolved(t, f)
	}
	require.Equal(t, f, g.ResolvedTs())
	requireFeed(t, whole, g.Rows(1, startTs, f), f, 7)
	requireFeed(t, partial, g.SpanRows(span, startTs, f), f, 7)
	requireFeed(t, other, g.Rows(3, 1, f), f, 7)
	require.Greater(t, len(whole.rows()), 1000)

	// Time passes: the feed continues where it was, without gaps or repeats.
	clock.Advance(55 * time.Millisecond)
	f2 := frontierAt(clock.Now(), testTick)
	require.Greater(t, f2, f)
	for _, s := range []*recordingSinkForTest{whole, partial, other} {
		s.waitResolved(t, f2)
	}
	requireFeed(t, whole, g.Rows(1, startTs, f2), f2, 7)
	requireFeed(t, partial, g.SpanRows(span, startTs, f2), f2, 7)
	requireFeed(t, other, g.Rows(3, 1, f2), f2, 7)

	st := g.Stats()
	require.Equal(t, f2, st.Frontier)
	pushed := len(whole.rows()) + len(partial.rows()) + len(other.rows())
	require.Equal(t, uint64(pushed), st.RowsPushed)
	require.GreaterOrEqual(t, st.RowsGenerated, st.RowsPushed)
	require.Equal(t, uint64(len(whole.batches())+len(partial.batches())+len(other.batches())), st.Batches)
	require.Len(t, st.Subscriptions, 3)
	for _, s := range st.Subscriptions {
		require.Equal(t, f2, s.ResolvedTs)
		require.Zero(t, s.Lag)
	}
}

// TestGeneratorCatchUpDoesNotStarveOthers: one pass gives each subscription
// at most one chunk, so a fresh subscription is served while an old one is
// still catching up.
func TestGeneratorCatchUpDoesNotStarveOthers(t *testing.T) {
	clock := clock.NewFake(t0.Add(time.Second))
	g := newTestGenerator(t, feedOptions(clock))
	f := frontierAt(clock.Now(), testTick)
	old, fresh := newRecordingSinkForTest(), newRecordingSinkForTest()
	oldRowsWhenFreshResolved := -1
	fresh.pushHook = func(_ context.Context, b eventstore.Batch) error {
		if b.ResolvedTs != 0 && oldRowsWhenFreshResolved < 0 {
			oldRowsWhenFreshResolved = len(old.rows())
		}
		return nil
	}
	_, err := g.Subscribe(common.TableSpan(1), 0, old)
	require.NoError(t, err)
	_, err = g.Subscribe(common.TableSpan(2), f-common.ComposeTs(testTick.Milliseconds(), 0), fresh)
	require.NoError(t, err)
	require.NoError(t, g.Start())
	old.waitResolved(t, f)
	fresh.waitResolved(t, f)
	total := len(g.Rows(1, 0, f))
	require.Greater(t, total, 100*7)
	require.Positive(t, oldRowsWhenFreshResolved)
	require.Less(t, oldRowsWhenFreshResolved, total/10, "fresh subscription waited for the catch-up")
	requireFeed(t, old, g.Rows(1, 0, f), f, 7)
	requireFeed(t, fresh, g.Rows(2, f-common.ComposeTs(testTick.Milliseconds(), 0), f), f, 7)
}

// TestGeneratorSparseCatchUp crosses 60,000 ticks of which a few hundred
// have rows: the driver generates only those (cost follows rows, not time).
func TestGeneratorSparseCatchUp(t *testing.T) {
	clock := clock.NewFake(t0.Add(10 * time.Minute))
	o := feedOptions(clock)
	o.RowsPerSec, o.TxnRows = 3, 1 // one row per table per second
	g := newTestGenerator(t, o)
	var generated atomic.Int64
	g.knobs.tickGenerated = func() { generated.Add(1) }
	sink := newRecordingSinkForTest()
	_, err := g.Subscribe(common.TableSpan(1), 0, sink)
	require.NoError(t, err)
	require.NoError(t, g.Start())
	f := frontierAt(clock.Now(), testTick)
	sink.waitResolved(t, f)
	want := g.Rows(1, 0, f)
	require.InDelta(t, 600, len(want), 60)
	requireFeed(t, sink, want, f, 7)
	ticks := map[int64]bool{}
	for _, r := range want {
		ticks[g.w.tickOf(r.CommitTs)] = true
	}
	require.Equal(t, int64(len(ticks)), generated.Load(), "ticks generated by the driver")
}

func TestGeneratorEndTs(t *testing.T) {
	clock := clock.NewFake(t0.Add(100 * time.Millisecond))
	o := feedOptions(clock)
	o.EndTs = tsAt(250, 3) // inside a tick
	g := newTestGenerator(t, o)
	w := watchPasses(g)
	sink := newRecordingSinkForTest()
	startTs := tsAt(50, 0)
	_, err := g.Subscribe(common.TableSpan(1), startTs, sink)
	require.NoError(t, err)
	require.NoError(t, g.Start())
	sink.waitResolved(t, frontierAt(clock.Now(), testTick))

	clock.Advance(time.Second)
	sink.waitResolved(t, o.EndTs)
	requireFeed(t, sink, g.Rows(1, startTs, o.EndTs), o.EndTs, 7)
	require.Equal(t, o.EndTs, g.ResolvedTs())
	batches := len(sink.batches())

	// Later ticks push nothing more; a late subscriber still catches up
	// exactly to EndTs.
	n := w.passes()
	clock.Advance(time.Second)
	w.waitIdle(t, n, o.EndTs)
	require.Len(t, sink.batches(), batches)
	late := newRecordingSinkForTest()
	_, err = g.Subscribe(common.TableSpan(1), 0, late)
	require.NoError(t, err)
	late.waitResolved(t, o.EndTs)
	requireFeed(t, late, g.Rows(1, 0, o.EndTs), o.EndTs, 7)
	require.Equal(t, g.Rows(1, 0, 1<<62), late.rows(), "nothing exists after EndTs")
}

func TestGeneratorFutureStartTs(t *testing.T) {
	clock := clock.NewFake(t0.Add(100 * time.Millisecond))
	g := newTestGenerator(t, feedOptions(clock))
	w := watchPasses(g)
	sink := newRecordingSinkForTest()
	startTs := tsAt(155, 7)
	_, err := g.Subscribe(common.TableSpan(1), startTs, sink)
	require.NoError(t, err)
	require.NoError(t, g.Start())
	w.waitIdle(t, 0, frontierAt(clock.Now(), testTick))
	require.Zero(t, sink.calls.Load(), "pushed before the frontier passed start-ts")
	clock.Advance(100 * time.Millisecond)
	f := frontierAt(clock.Now(), testTick)
	sink.waitResolved(t, f)
	requireFeed(t, sink, g.Rows(1, startTs, f), f, 7)
}

func TestGeneratorFrontierIsMonotonic(t *testing.T) {
	clock := clock.NewFake(t0.Add(200 * time.Millisecond))
	g := newTestGenerator(t, feedOptions(clock))
	w := watchPasses(g)
	sink := newRecordingSinkForTest()
	_, err := g.Subscribe(common.TableSpan(1), 0, sink)
	require.NoError(t, err)
	require.NoError(t, g.Start())
	f := frontierAt(clock.Now(), testTick)
	sink.waitResolved(t, f)
	batches := len(sink.batches())

	n := w.passes()
	clock.Set(t0.Add(-time.Hour)) // the clock jumps back
	clock.Advance(testTick)       // the next tick reads it
	w.waitIdle(t, n, f)
	require.Equal(t, f, g.ResolvedTs())
	require.Len(t, sink.batches(), batches)

	clock.Set(t0.Add(300 * time.Millisecond))
	clock.Advance(testTick)
	f2 := frontierAt(clock.Now(), testTick)
	sink.waitResolved(t, f2)
	requireFeed(t, sink, g.Rows(1, 0, f2), f2, 7)
}

func TestGeneratorRetriesAfterSinkError(t *testing.T) {
	errBoom := errors.New("boom")
	clock := clock.NewFake(t0.Add(200 * time.Millisecond))
	g := newTestGenerator(t, feedOptions(clock))
	sink := newRecordingSinkForTest()
	failed := make(chan struct{}, 2)
	calls := 0
	sink.pushHook = func(context.Context, eventstore.Batch) error {
		calls++ // only the driver goroutine calls the sink
		if calls == 2 || calls == 3 {
			failed <- struct{}{}
			return fmt.Errorf("store hiccup: %w", errBoom)
		}
		return nil
	}
	_, err := g.Subscribe(common.TableSpan(1), 0, sink)
	require.NoError(t, err)
	require.NoError(t, g.Start())
	for range 2 {
		<-failed
		clock.Advance(testTick) // a failed subscription retries on the next tick
	}
	f := frontierAt(clock.Now(), testTick)
	sink.waitResolved(t, f)
	requireFeed(t, sink, g.Rows(1, 0, f), f, 7)
	st := g.Stats()
	require.Equal(t, uint64(2), st.PushErrors)
	require.Equal(t, uint64(2), st.Subscriptions[0].PushErrors)
}

func TestGeneratorStopsFeedingClosedSink(t *testing.T) {
	clock := clock.NewFake(t0.Add(200 * time.Millisecond))
	g := newTestGenerator(t, feedOptions(clock))
	w := watchPasses(g)
	sink := newRecordingSinkForTest()
	sink.pushHook = func(context.Context, eventstore.Batch) error {
		return fmt.Errorf("store: %w", eventstore.ErrClosed)
	}
	_, err := g.Subscribe(common.TableSpan(1), 0, sink)
	require.NoError(t, err)
	require.NoError(t, g.Start())
	w.waitIdle(t, 0, frontierAt(clock.Now(), testTick))
	n := w.passes()
	clock.Advance(testTick)
	w.waitIdle(t, n, frontierAt(clock.Now(), testTick))
	require.Equal(t, int64(1), sink.calls.Load())
	st := g.Stats()
	require.Zero(t, st.PushErrors)
	require.True(t, st.Subscriptions[0].SinkClosed)
}

// blockingSinkForTest blocks every Push until its context is cancelled.
func blockingSinkForTest() (*recordingSinkForTest, <-chan struct{}, <-chan error) {
	entered := make(chan struct{})
	returned := make(chan error, 1)
	var once sync.Once
	s := newRecordingSinkForTest()
	s.pushHook = func(ctx context.Context, _ eventstore.Batch) error {
		once.Do(func() { close(entered) })
		<-ctx.Done()
		select {
		case returned <- ctx.Err():
		default: // only the first return is reported
		}
		return ctx.Err()
	}
	return s, entered, returned
}

func TestGeneratorCloseWhileSinkBlocks(t *testing.T) {
	clock := clock.NewFake(t0.Add(200 * time.Millisecond))
	g := newTestGenerator(t, feedOptions(clock))
	sink, entered, returned := blockingSinkForTest()
	_, err := g.Subscribe(common.TableSpan(1), 0, sink)
	require.NoError(t, err)
	require.NoError(t, g.Start())
	<-entered
	g.Close() // must return although the sink blocks
	require.ErrorIs(t, <-returned, context.Canceled)
	require.Zero(t, g.Stats().PushErrors, "cancellation is not a push error")
	g.Close() // idempotent
}

func TestGeneratorSubscriptionCloseWhileSinkBlocks(t *testing.T) {
	clock := clock.NewFake(t0.Add(200 * time.Millisecond))
	g := newTestGenerator(t, feedOptions(clock))
	w := watchPasses(g)
	blocked, entered, returned := blockingSinkForTest()
	healthy := newRecordingSinkForTest()
	sub, err := g.Subscribe(common.TableSpan(1), 0, blocked)
	require.NoError(t, err)
	_, err = g.Subscribe(common.TableSpan(2), 0, healthy)
	require.NoError(t, err)
	require.NoError(t, g.Start())
	<-entered
	sub.Close()
	require.ErrorIs(t, <-returned, context.Canceled)
	sub.Close() // idempotent

	// The other subscription keeps going; the closed one is never called again.
	clock.Advance(50 * time.Millisecond)
	f := frontierAt(clock.Now(), testTick)
	healthy.waitResolved(t, f)
	w.waitIdle(t, 0, f)
	require.Equal(t, int64(1), blocked.calls.Load())
	st := g.Stats()
	require.Len(t, st.Subscriptions, 1)
	require.Equal(t, common.TableSpan(2), st.Subscriptions[0].Span)
}

func TestGeneratorStatsLag(t *testing.T) {
	clock := clock.NewFake(t0.Add(200 * time.Millisecond))
	g := newTestGenerator(t, feedOptions(clock))
	w := watchPasses(g)
	stuck := newRecordingSinkForTest()
	stuck.pushHook = func(context.Context, eventstore.Batch) error { return errors.New("full") }
	startTs := tsAt(100, 0)
	_, err := g.Subscribe(common.TableSpan(1), startTs, stuck)
	require.NoError(t, err)
	_, err = g.Subscribe(common.TableSpan(2), 0, stuck) // older than the workload
	require.NoError(t, err)
	require.NoError(t, g.Start())
	f := frontierAt(clock.Now(), testTick)
	w.waitIdle(t, 0, f)
	st := g.Stats()
	s := st.Subscriptions[0]
	require.Equal(t, startTs, s.ResolvedTs)
	require.Equal(t, time.Duration(f.PhysicalMs()-startTs.PhysicalMs())*time.Millisecond, s.Lag)
	require.Positive(t, s.PushErrors)
	require.Zero(t, s.RowsPushed)
	s = st.Subscriptions[1]
	require.Zero(t, s.ResolvedTs)
	require.Equal(t, time.Duration(f.PhysicalMs()-t0.UnixMilli())*time.Millisecond, s.Lag, "lag counts from the workload's StartTs")
}

func TestGeneratorLifecycleErrors(t *testing.T) {
	clock := clock.NewFake(t0)
	g := newTestGenerator(t, feedOptions(clock))
	sink := newRecordingSinkForTest()

	_, err := g.Subscribe(common.TableSpan(1), 0, nil)
	require.ErrorIs(t, err, ErrInvalidArgument)
	_, err = g.Subscribe(common.Span{TableID: 1, StartKey: []byte("z"), EndKey: []byte("a")}, 0, sink)
	require.ErrorIs(t, err, ErrInvalidArgument)
	require.ErrorIs(t, err, common.ErrInvalidSpan)
	_, err = g.Subscribe(common.TableSpan(4), 0, sink)
	require.ErrorIs(t, err, ErrUnknownTable)
	_, err = g.Subscribe(common.TableSpan(0), 0, sink)
	require.ErrorIs(t, err, ErrUnknownTable)

	require.NoError(t, g.Start())
	require.ErrorIs(t, g.Start(), ErrAlreadyStarted)
	sub, err := g.Subscribe(common.TableSpan(1), 0, sink)
	require.NoError(t, err)
	g.Close()
	g.Close()
	require.ErrorIs(t, g.Start(), ErrClosed)
	_, err = g.Subscribe(common.TableSpan(1), 0, sink)
	require.ErrorIs(t, err, ErrClosed)
	sub.Close() // after the generator: harmless

	// Close without Start.
	g2 := newTestGenerator(t, feedOptions(clock))
	g2.Close()
	require.ErrorIs(t, g2.Start(), ErrClosed)
}

// TestGeneratorResolvedInterval: with ResolvedInterval, rows still arrive
// every tick but a subscription's resolved-ts advances once per interval
// (and at EndTs), and the rows delivered are the same.
func TestGeneratorResolvedInterval(t *testing.T) {
	clock := clock.NewFake(t0.Add(100 * time.Millisecond))
	o := feedOptions(clock)
	o.ResolvedInterval = 100 * time.Millisecond
	o.EndTs = tsAt(1000, 0)
	g := newTestGenerator(t, o)
	w := watchPasses(g)
	sink := newRecordingSinkForTest()
	_, err := g.Subscribe(common.TableSpan(1), 0, sink)
	require.NoError(t, err)
	require.NoError(t, g.Start())
	for range 60 { // 600 ms, tick by tick
		n := w.passes()
		clock.Advance(testTick)
		w.waitIdle(t, n, frontierAt(clock.Now(), testTick))
	}
	var advances int
	for _, b := range sink.batches() {
		if b.ResolvedTs != 0 {
			advances++
		}
	}
	require.LessOrEqual(t, advances, 7, "one advance per 100 ms, not per 10 ms tick")
	require.GreaterOrEqual(t, advances, 5)
	clock.Advance(time.Second)
	sink.waitResolved(t, o.EndTs)
	requireFeed(t, sink, g.Rows(1, 0, o.EndTs), o.EndTs, 7)
}

// TestGeneratorResolvedGroupTablesShareAPhase: with ResolvedGroupTables,
// the tables of one group (IDs 4 to 7 in groups of 4) get the same
// resolved-ts advances at the same pushes, where by default each table
// has a phase of its own and the same four tables' advances differ.
func TestGeneratorResolvedGroupTablesShareAPhase(t *testing.T) {
	advances := func(t *testing.T, group int) [][]common.Ts {
		clock := clock.NewFake(t0.Add(100 * time.Millisecond))
		o := feedOptions(clock)
		o.ResolvedInterval = 100 * time.Millisecond
		o.ResolvedGroupTables = group
		o.Tables = 8
		o.EndTs = tsAt(1000, 0)
		g := newTestGenerator(t, o)
		w := watchPasses(g)
		var sinks []*recordingSinkForTest
		for table := int64(4); table <= 7; table++ {
			sink := newRecordingSinkForTest()
			_, err := g.Subscribe(common.TableSpan(table), 0, sink)
			require.NoError(t, err)
			sinks = append(sinks, sink)
		}
		require.NoError(t, g.Start())
		for range 60 { // 600 ms, tick by tick, before EndTs (where every table advances)
			n := w.passes()
			clock.Advance(testTick)
			w.waitIdle(t, n, frontierAt(clock.Now(), testTick))
		}
		out := make([][]common.Ts, len(sinks))
		for i, sink := range sinks {
			for _, b := range sink.batches() {
				if b.ResolvedTs != 0 {
					out[i] = append(out[i], b.ResolvedTs)
				}
			}
			require.GreaterOrEqual(t, len(out[i]), 5, "table %d: one advance per 100 ms", i+4)
		}
		return out
	}
	grouped := advances(t, 4)
	for i := 1; i < len(grouped); i++ {
		require.Equal(t, grouped[0], grouped[i], "tables 4 and %d are in one group", i+4)
	}
	own := advances(t, 0)
	differ := false
	for i := 1; i < len(own); i++ {
		differ = differ || !slices.Equal(own[0], own[i])
	}
	require.True(t, differ, "by default each table has its own phase: %v", own)
}

// TestAGeneratorSubscriptionFitsItsSizeClass: a generator subscription
// stays within the 224-byte size class (its span packed; with a
// common.Span it was 264 bytes, the 288-byte class: 64 MB at a million
// subscriptions, in the million-table cdcserver run's own process).
func TestAGeneratorSubscriptionFitsItsSizeClass(t *testing.T) {
	require.LessOrEqual(t, unsafe.Sizeof(genSub{}), uintptr(224))
}

// TestGeneratorRetriesTheFinalAdvanceAfterAnotherSubscriptionsClose holds
// the workload's last resolved-ts advance, pushed for two subscriptions in
// one PushResolvedGuarded call, in the first one's sink, and closes the second
// subscription meanwhile: its Close cancels the whole call, so the first
// gets context.Canceled without being closed and must be retried. The
// retry used to be filed for the tick after the last elapsed one, a tick
// whose bucket is never taken once the frontier stops at EndTs, so the
// subscription stayed one tick short of the end for good (TestChurn's
// dispatchers stuck 10 ms short of the final resolved-ts under load).
func TestGeneratorRetriesTheFinalAdvanceAfterAnotherSubscriptionsClose(t *testing.T) {
	clock := clock.NewFake(t0.Add(200 * time.Millisecond))
	o := feedOptions(clock)
	o.RowsPerSec = 1 // nearly every tick is empty: the last advance is resolved-only
	o.EndTs = tsAt(250, 3)
	g := newTestGenerator(t, o)
	f1 := frontierAt(clock.Now(), testTick)
	for table := int64(1); table <= 2; table++ {
		require.Empty(t, g.Rows(table, f1, o.EndTs), "the test needs a last advance without rows (table %d)", table)
	}

	// Only the last advance is held: the catch-up before it goes through.
	held, entered, cancelled := holdOnceSinkForTest(func(b eventstore.Batch) bool { return b.ResolvedTs == o.EndTs })
	other := newRecordingSinkForTest()
	_, err := g.Subscribe(common.TableSpan(1), 0, held)
	require.NoError(t, err)
	closing, err := g.Subscribe(common.TableSpan(2), 0, other)
	require.NoError(t, err)
	require.NoError(t, g.Start())
	held.waitResolved(t, f1)
	other.waitResolved(t, f1)

	clock.Advance(time.Second) // the frontier reaches EndTs: both advance in one call
	<-entered
	closing.Close() // cancels the call; returns once it has
	require.ErrorIs(t, <-cancelled, context.Canceled, "the held advance was cancelled")

	clock.Advance(testTick) // the next pass (at the latest) retries it
	held.waitResolved(t, o.EndTs)
	require.Equal(t, g.Rows(1, 0, o.EndTs), held.rows())
	require.Zero(t, g.Stats().PushErrors, "a cancellation is not a push error")
}

// TestARowCacheIsDroppedOnceItsTickIsPushed: a tick split across pushes
// keeps its rows cached between them (generated once), and once the
// cursor has passed the tick the subscription holds no rows: a million
// tables each holding its last tick's rows grew the heap for the whole
// run. Driven by feed directly (no driver), so the test owns the
// subscription's driver-owned fields.
func TestARowCacheIsDroppedOnceItsTickIsPushed(t *testing.T) {
	clk := clock.NewFake(t0.Add(25 * time.Millisecond))
	g := newTestGenerator(t, feedOptions(clk)) // 20 rows a tick, 7 a push
	var generated atomic.Int64
	g.knobs.tickGenerated = func() { generated.Add(1) }
	sink := newRecordingSinkForTest()
	_, err := g.Subscribe(common.TableSpan(1), tsAt(0, 0), sink)
	require.NoError(t, err)
	g.mu.Lock()
	var s *genSub
	for sub := range g.mu.subs.All() {
		s = sub
	}
	g.mu.Unlock()
	tg := newTickGen(g.w)
	f := frontierAt(clk.Now(), testTick)

	require.Equal(t, feedMore, g.feed(s, f, tg))
	require.NotEqual(t, int64(noCacheTick), s.cacheTick, "a tick split across pushes stays cached")
	require.Equal(t, s.cur.tick, s.cacheTick)
	before := generated.Load()
	for range 100 {
		if g.feed(s, f, tg) != feedMore {
			break
		}
	}
	require.Equal(t, f, sink.resolved())
	require.Nil(t, s.cache, "the passed tick's rows are let go")
	require.Equal(t, int64(noCacheTick), s.cacheTick)
	require.Equal(t, g.Rows(1, tsAt(0, 0), f), sink.rows(), "every row, once, in order")
	require.Greater(t, generated.Load(), before, "later ticks were generated")
}

// TestGeneratorBatchedAdvanceSurvivesAnotherSubscriptionsClose: with only
// resolved-ts advances due (no rows in range), the generator pushes its
// subscriptions' advances in one eventstore.PushResolvedGuarded call.
// Closing one of them while another's sink blocks cancels the whole call;
// the closed one is dropped, the cancelled one is not: it gets the next
// advance.
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

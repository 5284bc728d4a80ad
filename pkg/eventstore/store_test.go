package eventstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
)

func TestOrderingTxnBoundariesAndRanges(t *testing.T) {
	env := newTestEnv(t, nil)
	rec := newRecorder()
	require.NoError(t, env.store.RegisterDispatcher(did(1), common.TableSpan(1), 10, rec))
	sub := env.up.last(t, common.TableSpan(1))
	require.Equal(t, common.Ts(10), sub.startTs)

	// Two transactions share commit-ts 20 (start-ts 12 and 15); pushed out
	// of order to prove the store orders them.
	push(t, sub, 0, put("b", 15, 20), put("z", 12, 20), put("a", 15, 20))
	push(t, sub, 30, put("c", 11, 20), put("k", 25, 30), put("j", 25, 30))
	n := rec.waitResolved(t, 30)
	require.Equal(t, notification{30, 30}, n)

	rows, txns := scan(t, env.store, did(1), ScanRange{Start: 10, End: 30})
	require.Equal(t, []string{"c", "z", "a", "b", "j", "k"}, keysOf(rows))
	require.Equal(t, []int{0, 1, 2, 4}, txns, "txns (20,11), (20,12), (20,15), (30,25)")
	require.Equal(t, []byte("v-a"), rows[2].Value)

	// (start, end] bounds: exclusive start, inclusive end.
	rows, _ = scan(t, env.store, did(1), ScanRange{Start: 20, End: 30})
	require.Equal(t, []string{"j", "k"}, keysOf(rows))
	rows, _ = scan(t, env.store, did(1), ScanRange{Start: 10, End: 20})
	require.Len(t, rows, 4)
	rows, _ = scan(t, env.store, did(1), ScanRange{Start: 20, End: 20})
	require.Empty(t, rows)

	// Txn cursor: resume after txn (20, 12) yields the next txn sharing 20.
	rows, txns = scan(t, env.store, did(1), ScanRange{Start: 10, End: 30, After: &Cursor{CommitTs: 20, StartTs: 12}})
	require.Equal(t, []string{"a", "b", "j", "k"}, keysOf(rows))
	require.Equal(t, []int{0, 2}, txns)
	// Row cursor: resume strictly after row (20, 15, "a"), inside the txn.
	rows, txns = scan(t, env.store, did(1), ScanRange{Start: 10, End: 30, After: &Cursor{CommitTs: 20, StartTs: 15, Key: []byte("a")}})
	require.Equal(t, []string{"b", "j", "k"}, keysOf(rows))
	require.Equal(t, []int{0, 1}, txns, "the first row after a cursor is reported as a txn start of the scan")
	// A cursor on the last row of a txn resumes at the next txn.
	rows, _ = scan(t, env.store, did(1), ScanRange{Start: 10, End: 30, After: &Cursor{CommitTs: 20, StartTs: 15, Key: []byte("b")}})
	require.Equal(t, []string{"j", "k"}, keysOf(rows))
}

func TestRangeErrors(t *testing.T) {
	env := newTestEnv(t, nil)
	rec := newRecorder()
	require.NoError(t, env.store.RegisterDispatcher(did(1), common.TableSpan(1), 10, rec))
	sub := env.up.last(t, common.TableSpan(1))
	push(t, sub, 50, put("a", 15, 20))
	rec.waitResolved(t, 50)
	require.NoError(t, env.store.UpdateCheckpoint(did(1), 30))

	cases := []struct {
		r    ScanRange
		want error
	}{
		{ScanRange{Start: 29, End: 40}, ErrRangeBelowCheckpoint},
		{ScanRange{Start: 30, End: 51}, ErrRangeAboveResolved},
		{ScanRange{Start: 40, End: 35}, ErrInvalidRange},
		{ScanRange{Start: 30, End: 40, After: &Cursor{CommitTs: 30}}, ErrInvalidRange},
		{ScanRange{Start: 30, End: 40, After: &Cursor{CommitTs: 41}}, ErrInvalidRange},
	}
	for _, c := range cases {
		_, err := env.store.NewIterator(did(1), c.r)
		require.ErrorIs(t, err, c.want, "%+v", c.r)
	}
	_, err := env.store.NewIterator(did(2), ScanRange{Start: 30, End: 40})
	require.ErrorIs(t, err, ErrDispatcherNotFound)
	rows, _ := scan(t, env.store, did(1), ScanRange{Start: 30, End: 50})
	require.Empty(t, rows)
}

func TestBadPushesAreRefusedAndCounted(t *testing.T) {
	env := newTestEnv(t, nil)
	rec := newRecorder()
	span := common.Span{TableID: 1, StartKey: []byte("b"), EndKey: []byte("m")}
	require.NoError(t, env.store.RegisterDispatcher(did(1), span, 10, rec))
	sub := env.up.last(t, span)
	push(t, sub, 40, put("c", 15, 20))
	rec.waitResolved(t, 40)

	ctx := context.Background()
	err := sub.sink.Push(ctx, Batch{Rows: []common.Row{
		put("d", 35, 40),  // at resolved
		put("e", 38, 45),  // fine
		put("zz", 38, 45), // outside span
		{Op: 9, Key: []byte("f"), StartTs: 1, CommitTs: 50}, // bad op
		put("g", 50, 50), // start-ts not below commit-ts
		{Op: common.OpPut, StartTs: 1, CommitTs: 50}, // empty key
	}})
	require.ErrorIs(t, err, ErrRowBeforeResolved)
	require.ErrorIs(t, err, ErrRowOutsideSpan)
	require.ErrorIs(t, err, ErrInvalidRow)
	err = sub.sink.Push(ctx, Batch{ResolvedTs: 30})
	require.ErrorIs(t, err, ErrResolvedTsRegressed)
	push(t, sub, 60)
	rec.waitResolved(t, 60)

	rows, _ := scan(t, env.store, did(1), ScanRange{Start: 10, End: 60})
	require.Equal(t, []string{"c", "e"}, keysOf(rows), "only the valid rows were kept")
	m := env.store.metrics.rejectedRows
	require.Equal(t, 1.0, testutil.ToFloat64(m.WithLabelValues(rejectBeforeResolved)))
	require.Equal(t, 1.0, testutil.ToFloat64(m.WithLabelValues(rejectOutsideSpan)))
	require.Equal(t, 3.0, testutil.ToFloat64(m.WithLabelValues(rejectInvalid)))
}

func TestBadRegistrations(t *testing.T) {
	env := newTestEnv(t, nil)
	s := env.store
	nop := func(common.Ts, common.Ts) {}
	require.ErrorIs(t, s.RegisterDispatcher(common.DispatcherID{}, common.TableSpan(1), 1, NotifierFunc(nop)), ErrInvalidArgument)
	require.ErrorIs(t, s.RegisterDispatcher(did(1), common.TableSpan(1), 1, nil), ErrInvalidArgument)
	require.ErrorIs(t, s.RegisterDispatcher(did(1), common.TableSpan(1), 1, NotifierFunc(nil)), ErrInvalidArgument)
	err := s.RegisterDispatcher(did(1), common.Span{TableID: 1, StartKey: []byte("b"), EndKey: []byte("a")}, 1, NotifierFunc(nop))
	require.ErrorIs(t, err, ErrInvalidArgument)
	require.ErrorIs(t, err, common.ErrInvalidSpan)
	require.NoError(t, s.RegisterDispatcher(did(1), common.TableSpan(1), 1, NotifierFunc(nop)))
	require.ErrorIs(t, s.RegisterDispatcher(did(1), common.TableSpan(2), 1, NotifierFunc(nop)), ErrDispatcherExists)
	require.ErrorIs(t, s.UnregisterDispatcher(did(9)), ErrDispatcherNotFound)
	require.ErrorIs(t, s.UpdateCheckpoint(did(9), 5), ErrDispatcherNotFound)
	_, err = s.Dispatcher(did(9))
	require.ErrorIs(t, err, ErrDispatcherNotFound)

	boom := errors.New("upstream down")
	env.up.mu.Lock()
	env.up.mu.failOn = boom
	env.up.mu.Unlock()
	require.ErrorIs(t, s.RegisterDispatcher(did(2), common.TableSpan(7), 1, NotifierFunc(nop)), boom)
	require.Equal(t, 1, s.Stats().Dispatchers, "a failed registration leaves nothing behind")
	require.Equal(t, 1, s.Stats().Subscriptions)
}

func TestSharedSubscriptionFanOut(t *testing.T) {
	env := newTestEnv(t, nil)
	span := common.TableSpan(3)
	r1, r2, r3 := newRecorder(), newRecorder(), newRecorder()
	require.NoError(t, env.store.RegisterDispatcher(did(1), span, 10, r1))
	require.NoError(t, env.store.RegisterDispatcher(did(2), span, 10, r2))
	require.Len(t, env.up.subs(), 1, "identical spans share one upstream subscription")
	sub := env.up.last(t, span)
	push(t, sub, 30, put("a", 15, 20))
	require.Equal(t, notification{30, 20}, r1.next(t))
	require.Equal(t, notification{30, 20}, r2.next(t))

	// A late joiner whose start-ts is below the resolved-ts is caught up at
	// registration, without waiting for the next advance.
	require.NoError(t, env.store.RegisterDispatcher(did(3), span, 25, r3))
	require.Equal(t, notification{30, 20}, r3.next(t))
	rows, _ := scan(t, env.store, did(3), ScanRange{Start: 25, End: 30})
	require.Empty(t, rows)
	rows, _ = scan(t, env.store, did(1), ScanRange{Start: 10, End: 30})
	require.Equal(t, []string{"a"}, keysOf(rows))

	// A dispatcher starting below the shared subscription's checkpoint gets
	// its own subscription (the shared one may have collected those rows).
	for _, id := range []uint64{1, 2, 3} {
		require.NoError(t, env.store.UpdateCheckpoint(did(id), 28))
	}
	require.NoError(t, env.store.RegisterDispatcher(did(4), span, 12, newRecorder()))
	require.Len(t, env.up.subs(), 2)
	st, err := env.store.Dispatcher(did(4))
	require.NoError(t, err)
	require.Equal(t, common.Ts(12), st.StartTs)
	require.NotEqual(t, uint64(1), st.SubscriptionID)
}

func TestNotifyAfterCommitAndMonotonic(t *testing.T) {
	env := newTestEnv(t, func(o *Options) { o.MaxBatchRows = 7 })
	span := common.TableSpan(1)
	type seen struct {
		resolved common.Ts
		rows     int
	}
	results := make(chan seen, 1024)
	var store *Store = env.store
	var last common.Ts
	notifier := func(resolved, _ common.Ts) {
		// Inside the callback every row at or below resolved is readable.
		it, err := store.NewIterator(did(1), ScanRange{Start: 0, End: resolved})
		if err != nil {
			panic(err)
		}
		n := 0
		for it.Next() {
			n++
		}
		_ = it.Close()
		if resolved <= last {
			panic("notification not increasing")
		}
		last = resolved
		results <- seen{resolved, n}
	}
	require.NoError(t, env.store.RegisterDispatcher(did(1), span, 0, NotifierFunc(notifier)))
	sub := env.up.last(t, span)
	const batches = 200
	go func() {
		for i := 1; i <= batches; i++ {
			ts := common.Ts(i * 10)
			rows := []common.Row{put("a", ts-2, ts-1), put("b", ts-2, ts-1), put("c", ts-3, ts-1)}
			_ = sub.sink.Push(context.Background(), Batch{Rows: rows, ResolvedTs: ts})
			_ = sub.sink.Push(context.Background(), Batch{ResolvedTs: ts}) // duplicate: no notify
		}
	}()
	for {
		r := <-results
		require.Equal(t, int(r.resolved/10)*3, r.rows, "resolved %v", r.resolved)
		if r.resolved == batches*10 {
			break
		}
	}
	require.Empty(t, results)
}

func TestUnregisterStopsNotifications(t *testing.T) {
	env := newTestEnv(t, nil)
	waiting := make(chan struct{})
	var waitingOnce sync.Once
	// Idempotent: Close at cleanup may find the second dispatcher's
	// callback in flight too and fire the hook again.
	env.store.knobs.stopWaits = func() { waitingOnce.Do(func() { close(waiting) }) }
	entered, release := make(chan struct{}, 1), make(chan struct{})
	var releaseOnce sync.Once
	releaseCallback := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(releaseCallback) // runs before the store's Close, even after a failure
	var calls int
	var mu sync.Mutex
	notifier := func(common.Ts, common.Ts) {
		mu.Lock()
		calls++
		mu.Unlock()
		select {
		case entered <- struct{}{}:
		default:
		}
		<-release
	}
	require.NoError(t, env.store.RegisterDispatcher(did(1), common.TableSpan(1), 0, NotifierFunc(notifier)))
	sub := env.up.last(t, common.TableSpan(1))
	push(t, sub, 10)
	<-entered // a callback is in flight
	unregistered := make(chan struct{})
	var unregisterErr error
	go func() {
		unregisterErr = env.store.UnregisterDispatcher(did(1))
		close(unregistered)
	}()
	// Unregister must find the callback running and wait for it: the hook
	// fires exactly then. An Unregister that did not wait would never fire
	// it and would return first.
	select {
	case <-waiting:
	case <-unregistered:
		t.Fatal("Unregister returned while a callback was running")
	}
	select {
	case <-unregistered:
		t.Fatal("Unregister returned while a callback was running")
	default:
	}
	releaseCallback()
	<-unregistered
	require.NoError(t, unregisterErr)
	push(t, sub, 20)
	push(t, sub, 30, put("x", 25, 26))
	// A second dispatcher on the same subscription observes 30, which proves
	// the worker processed the pushes after the unregistration.
	r := newRecorder()
	require.NoError(t, env.store.RegisterDispatcher(did(2), common.TableSpan(1), 0, r))
	r.waitResolved(t, 30)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 1, calls)
}

func TestGCNeverDeletesAtOrAboveCheckpoint(t *testing.T) {
	// No fresh rows: every row is written to pebble, whose GC this checks.
	env := newTestEnv(t, func(o *Options) { o.GCMinSpan = time.Millisecond; o.FreshBytes = -1 })
	ms := func(n int64) common.Ts { return common.ComposeTs(n, 0) }
	span := common.TableSpan(1)
	r1, r2 := newRecorder(), newRecorder()
	require.NoError(t, env.store.RegisterDispatcher(did(1), span, 0, r1))
	require.NoError(t, env.store.RegisterDispatcher(did(2), span, 0, r2))
	sub := env.up.last(t, span)
	var rows []common.Row
	for n := int64(10); n <= 100; n += 10 {
		rows = append(rows, put("k", ms(n)-1, ms(n)))
	}
	push(t, sub, ms(100), rows...)
	r1.waitResolved(t, ms(100))

	require.NoError(t, env.store.UpdateCheckpoint(did(1), ms(70)))
	require.NoError(t, env.store.UpdateCheckpoint(did(2), ms(40)))
	require.NoError(t, env.store.UpdateCheckpoint(did(2), ms(30)), "a lower checkpoint is ignored")
	env.store.maintain()
	require.Equal(t, 1.0, testutil.ToFloat64(env.store.metrics.gcRangesDeleted))

	// Dispatcher 2 (checkpoint 40) still reads everything above 40, and the
	// row at exactly 40 survives: GC is strictly below the minimum.
	got, _ := scan(t, env.store, did(2), ScanRange{Start: ms(40), End: ms(100)})
	require.Len(t, got, 6)
	require.Equal(t, 7, countRaw(t, env.store, sub), "rows 40..100 remain, 10..30 are gone")

	// Without new checkpoints nothing more is deleted.
	env.store.maintain()
	require.Equal(t, 1.0, testutil.ToFloat64(env.store.metrics.gcRangesDeleted))
	// A checkpoint above resolved is capped at resolved.
	require.NoError(t, env.store.UpdateCheckpoint(did(2), ms(1000)))
	st, err := env.store.Dispatcher(did(2))
	require.NoError(t, err)
	require.Equal(t, ms(100), st.Checkpoint)
	env.store.maintain()
	require.Equal(t, 4, countRaw(t, env.store, sub), "min checkpoint is now 70: rows 70..100 remain")
}

func TestGCCoalescesSmallRanges(t *testing.T) {
	// No fresh rows: every row is written to pebble, whose GC this checks.
	env := newTestEnv(t, func(o *Options) { o.GCMinSpan = 5 * time.Second; o.GCMaxDelay = 30 * time.Second; o.FreshBytes = -1 })
	r := newRecorder()
	require.NoError(t, env.store.RegisterDispatcher(did(1), common.TableSpan(1), 0, r))
	sub := env.up.last(t, common.TableSpan(1))
	base := common.ComposeTs(1_700_000_000_000, 0)
	push(t, sub, base, put("k", base-2, base-1))
	r.waitResolved(t, base)
	require.NoError(t, env.store.UpdateCheckpoint(did(1), base))
	env.store.maintain() // first GC from zero deletes everything below base
	require.Equal(t, 1.0, testutil.ToFloat64(env.store.metrics.gcRangesDeleted))

	// Checkpoints advancing by 1s at a time are held back until the range
	// spans 5s of physical time...
	ms := int64(1_700_000_000_000)
	var rows []common.Row
	for at := ms + 100; at < ms+60_000; at += 100 {
		rows = append(rows, put("k", common.ComposeTs(at, 0), common.ComposeTs(at, 1)))
	}
	push(t, sub, common.ComposeTs(ms+60_000, 0), rows...)
	r.waitResolved(t, common.ComposeTs(ms+60_000, 0))
	for i := int64(1); i <= 4; i++ {
		require.NoError(t, env.store.UpdateCheckpoint(did(1), common.ComposeTs(ms+i*1000, 0)))
		env.store.maintain()
	}
	require.Equal(t, 1.0, testutil.ToFloat64(env.store.metrics.gcRangesDeleted))
	require.NoError(t, env.store.UpdateCheckpoint(did(1), common.ComposeTs(ms+5000, 0)))
	env.store.maintain()
	require.Equal(t, 2.0, testutil.ToFloat64(env.store.metrics.gcRangesDeleted))
	// ...or until the oldest pending part waited GCMaxDelay.
	require.NoError(t, env.store.UpdateCheckpoint(did(1), common.ComposeTs(ms+5500, 0)))
	env.store.maintain()
	require.Equal(t, 2.0, testutil.ToFloat64(env.store.metrics.gcRangesDeleted))
	env.clk.Advance(30 * time.Second)
	env.store.maintain()
	require.Equal(t, 3.0, testutil.ToFloat64(env.store.metrics.gcRangesDeleted))
}

// TestGCSkipsRangesWithoutRows: checkpoints of a subscription that wrote no
// rows move its GC mark without a range deletion (a million idle tables
// must not fill the memtable with tombstones every iterator pays for); once
// it writes rows, their range is deleted.
func TestGCSkipsRangesWithoutRows(t *testing.T) {
	// No fresh rows: every row is written to pebble, whose GC this checks.
	env := newTestEnv(t, func(o *Options) { o.GCMinSpan = time.Second; o.FreshBytes = -1 })
	r := newRecorder()
	require.NoError(t, env.store.RegisterDispatcher(did(1), common.TableSpan(1), 0, r))
	sub := env.up.last(t, common.TableSpan(1))
	ms := int64(1_700_000_000_000)
	at := func(d int64) common.Ts { return common.ComposeTs(ms+d, 0) }
	for i := int64(1); i <= 10; i++ {
		push(t, sub, at(i*1000))
		r.waitResolved(t, at(i*1000))
		require.NoError(t, env.store.UpdateCheckpoint(did(1), at(i*1000)))
		env.store.maintain()
	}
	require.Zero(t, testutil.ToFloat64(env.store.metrics.gcRangesDeleted), "no rows, no tombstones")

	push(t, sub, at(20_000), put("k", at(15_000), at(15_000)+1))
	r.waitResolved(t, at(20_000))
	require.Equal(t, 1, countRaw(t, env.store, sub))
	require.NoError(t, env.store.UpdateCheckpoint(did(1), at(20_000)))
	env.store.maintain()
	require.Equal(t, 1.0, testutil.ToFloat64(env.store.metrics.gcRangesDeleted))
	require.Zero(t, countRaw(t, env.store, sub), "the written row's range was deleted")
}

func TestIdleSubscriptionEndsAfterTTL(t *testing.T) {
	// One write worker: the ended subscription's deletion, queued by
	// maintain, is then processed before the new subscription's push, so
	// waiting for that push's notification orders the row count after the
	// deletion. (With several workers the two may run on different ones.)
	env := newTestEnv(t, func(o *Options) { o.WriteWorkers = 1 })
	span := common.TableSpan(1)
	r := newRecorder()
	require.NoError(t, env.store.RegisterDispatcher(did(1), span, 0, r))
	sub := env.up.last(t, span)
	push(t, sub, 20, put("a", 5, 10))
	r.waitResolved(t, 20)
	require.NoError(t, env.store.UnregisterDispatcher(did(1)))

	// Re-registering within the TTL reuses the subscription and its rows.
	env.clk.Advance(500 * time.Millisecond)
	env.store.maintain()
	require.False(t, sub.isClosed())
	require.NoError(t, env.store.RegisterDispatcher(did(2), span, 0, r))
	require.Len(t, env.up.subs(), 1)
	rows, _ := scan(t, env.store, did(2), ScanRange{Start: 0, End: 20})
	require.Len(t, rows, 1)
	require.NoError(t, env.store.UnregisterDispatcher(did(2)))

	env.clk.Advance(time.Second)
	env.store.maintain()
	require.True(t, sub.isClosed(), "the upstream feed ends after the TTL")
	require.Equal(t, 0, env.store.Stats().Subscriptions)
	require.ErrorIs(t, sub.sink.Push(context.Background(), Batch{ResolvedTs: 30}), ErrClosed)

	// A new registration subscribes afresh; the old rows are deleted.
	r3 := newRecorder()
	require.NoError(t, env.store.RegisterDispatcher(did(3), span, 0, r3))
	require.Len(t, env.up.subs(), 2)
	sub2 := env.up.last(t, span)
	push(t, sub2, 20)
	r3.waitResolved(t, 20)
	require.Equal(t, 0, countRaw(t, env.store, sub), "the ended subscription's rows are deleted")
}

// TestWriteBatchesAreBoundedInBytes: a worker stops grouping queued pushes
// into one pebble batch at MaxBatchBytes, whatever MaxBatchRows allows.
func TestWriteBatchesAreBoundedInBytes(t *testing.T) {
	up := &fakeUpstreamForTest{}
	reg := prometheus.NewRegistry()
	s, err := Open(Options{Upstream: up, WriteWorkers: 1, MaxBatchBytes: 3000, Registerer: reg,
		MaintenanceInterval: time.Hour, FreshBytes: -1}) // every row is written to pebble
	require.NoError(t, err)
	defer func() { require.NoError(t, s.Close()) }()
	span := common.TableSpan(1)
	rec := newRecorder()
	require.NoError(t, s.RegisterDispatcher(did(1), span, 0, rec))
	sub := up.last(t, span)
	wide := make([]byte, 1000)
	// Queued before the worker starts, so it finds all ten at once.
	for i := range 10 {
		ts := common.Ts(10 * (i + 1))
		push(t, sub, ts, common.Row{Op: common.OpPut, Key: fmt.Appendf(nil, "k%d", i), Value: wide, StartTs: ts - 1, CommitTs: ts})
	}
	require.NoError(t, s.Start())
	rec.waitResolved(t, 100)
	var batches uint64
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == "cdcflow_eventstore_write_batch_duration_seconds" {
			batches = mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	require.Equal(t, uint64(4), batches, "ten rows of 1 kB in batches of at least 3000 bytes: 3, 3, 3, 1")
}

func TestCloseDuringWrites(t *testing.T) {
	up := &fakeUpstreamForTest{}
	s, err := Open(Options{Upstream: up, WriteQueueSize: 1, MaxBatchRows: 1})
	require.NoError(t, err)
	require.NoError(t, s.Start())
	var wg sync.WaitGroup
	for i := range 4 {
		span := common.TableSpan(int64(i + 1))
		require.NoError(t, s.RegisterDispatcher(did(uint64(i+1)), span, 0, NotifierFunc(func(common.Ts, common.Ts) {})))
		sub := up.last(t, span)
		wg.Go(func() {
			for ts := common.Ts(2); ; ts++ {
				err := sub.sink.Push(context.Background(), Batch{Rows: []common.Row{put("k", ts-1, ts)}, ResolvedTs: ts})
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					panic(err)
				}
			}
		})
	}
	// Let the writers make progress, then close under load.
	rec := newRecorder()
	require.NoError(t, s.RegisterDispatcher(did(99), common.TableSpan(1), 0, rec))
	rec.waitResolved(t, 50)
	require.NoError(t, s.Close())
	wg.Wait() // every blocked Push returned ErrClosed
	require.NoError(t, s.Close(), "Close is idempotent")

	nop := func(common.Ts, common.Ts) {}
	require.ErrorIs(t, s.RegisterDispatcher(did(50), common.TableSpan(9), 0, NotifierFunc(nop)), ErrClosed)
	require.ErrorIs(t, s.UnregisterDispatcher(did(1)), ErrClosed)
	require.ErrorIs(t, s.UpdateCheckpoint(did(1), 1), ErrClosed)
	_, err = s.NewIterator(did(1), ScanRange{})
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, s.Start(), ErrClosed)
	for _, sub := range up.subs() {
		require.True(t, sub.isClosed())
	}
}

func TestOptionsValidationReportsEveryField(t *testing.T) {
	_, err := Open(Options{WriteWorkers: -1, WriteQueueSize: -1, MaxBatchRows: -1, IdleTTL: -1,
		MaintenanceInterval: -1, GCMinSpan: -1, GCMaxDelay: -1, GCInterval: -1, CacheBytes: -1, MemTableBytes: 10,
		ExpectedDispatchers: -1})
	require.ErrorIs(t, err, ErrInvalidOptions)
	for _, field := range []string{"Upstream", "WriteWorkers", "WriteQueueSize", "MaxBatchRows", "IdleTTL",
		"MaintenanceInterval", "GCMinSpan", "GCMaxDelay", "GCInterval", "CacheBytes", "MemTableBytes", "ExpectedDispatchers"} {
		require.Contains(t, err.Error(), field)
	}
	// The size hint is bounded: a hint of billions would allocate at Open.
	_, err = Open(Options{Upstream: &fakeUpstreamForTest{}, ExpectedDispatchers: MaxExpectedDispatchers + 1})
	require.ErrorIs(t, err, ErrInvalidOptions)
	require.Contains(t, err.Error(), "ExpectedDispatchers")
	_, err = Open(Options{Upstream: (*fakeUpstreamForTest)(nil), Clock: (*clock.Fake)(nil)})
	require.ErrorIs(t, err, ErrInvalidOptions)
	require.Contains(t, err.Error(), "Upstream is a nil *eventstore.fakeUpstreamForTest")
	require.Contains(t, err.Error(), "Clock is a nil *clock.Fake")
}

func TestDiskDirIsResetAndForeignDirRefused(t *testing.T) {
	dir := t.TempDir()
	foreign := filepath.Join(dir, "foreign")
	require.NoError(t, os.MkdirAll(foreign, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(foreign, "precious.txt"), []byte("keep"), 0o644))
	_, err := Open(Options{Dir: foreign, Upstream: &fakeUpstreamForTest{}})
	require.ErrorIs(t, err, ErrInvalidOptions)
	_, err = os.Stat(filepath.Join(foreign, "precious.txt"))
	require.NoError(t, err, "a foreign directory is never wiped")

	storeDir := filepath.Join(dir, "store")
	up := &fakeUpstreamForTest{}
	s, err := Open(Options{Dir: storeDir, Upstream: up})
	require.NoError(t, err)
	require.NoError(t, s.Start())
	r := newRecorder()
	require.NoError(t, s.RegisterDispatcher(did(1), common.TableSpan(1), 0, r))
	push(t, up.last(t, common.TableSpan(1)), 20, put("a", 5, 10))
	r.waitResolved(t, 20)
	require.NoError(t, s.Close())

	// Reopening wipes the cache: the upstream is the source of truth.
	up2 := &fakeUpstreamForTest{}
	s2, err := Open(Options{Dir: storeDir, Upstream: up2})
	require.NoError(t, err)
	require.NoError(t, s2.Start())
	r2 := newRecorder()
	require.NoError(t, s2.RegisterDispatcher(did(1), common.TableSpan(1), 0, r2))
	push(t, up2.last(t, common.TableSpan(1)), 20)
	r2.waitResolved(t, 20)
	rows, _ := scan(t, s2, did(1), ScanRange{Start: 0, End: 20})
	require.Empty(t, rows)
	require.NoError(t, s2.Close())
}

func TestMetricsRegisterAndLint(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	// The writer adds a batch's callbacks to the counter after they
	// returned, so a recorder can see the last one before it is counted:
	// the counter is read once all of them are in.
	var accounted atomic.Int64
	allAccounted := make(chan struct{})
	env := newTestEnv(t, func(o *Options) { o.Registerer = reg }, func(s *Store) {
		s.knobs.accounted = func(notified int) {
			if accounted.Add(int64(notified)) == notifySampleEvery {
				close(allAccounted)
			}
		}
	})
	r := newRecorder()
	require.NoError(t, env.store.RegisterDispatcher(did(1), common.TableSpan(1), 0, r))
	push(t, env.up.last(t, common.TableSpan(1)), 20, put("a", 5, 10))
	r.waitResolved(t, 20)
	for ts := common.Ts(21); ts < 20+notifySampleEvery; ts++ { // one of any notifySampleEvery in a row is timed
		push(t, env.up.last(t, common.TableSpan(1)), ts)
		r.waitResolved(t, ts)
	}
	select {
	case <-allAccounted:
	case <-time.After(10 * time.Second):
		t.Fatalf("%d of %d callbacks accounted", accounted.Load(), notifySampleEvery)
	}
	for _, c := range env.store.metrics.collectors() {
		problems, err := testutil.CollectAndLint(c)
		require.NoError(t, err)
		require.Empty(t, problems)
	}
	// The one dispatcher is scanned from memory only, so its row is
	// deferred, not written (fresh.go's write-behind).
	require.Equal(t, 1.0, testutil.ToFloat64(env.store.metrics.rowsDeferred))
	require.Zero(t, testutil.ToFloat64(env.store.metrics.rowsWritten))
	require.Equal(t, float64(notifySampleEvery), testutil.ToFloat64(env.store.metrics.notifications))
	st := env.store.Stats()
	require.Equal(t, uint64(notifySampleEvery), st.NotifyCount)
	require.Positive(t, st.NotifyMax)
	// A second store cannot register on the same registry: an error, not a panic.
	_, err := Open(Options{Upstream: &fakeUpstreamForTest{}, Registerer: reg})
	require.Error(t, err)
	// The failed Open must not have unregistered the first store's
	// collectors (Unregister matches by descriptor, not by instance).
	n, err := testutil.GatherAndCount(reg, "cdcflow_eventstore_rows_written_total")
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

// countRaw counts the stored rows of a subscription, bypassing the
// dispatcher-level checks.
func countRaw(t *testing.T, s *Store, sub *fakeSubForTest) int {
	t.Helper()
	id := sub.sink.(*sink).id
	it, err := s.db.NewIter(nil)
	require.NoError(t, err)
	defer func() { require.NoError(t, it.Close()) }()
	n := 0
	for ok := it.SeekGE(subBoundary(id)); ok; ok = it.Next() {
		got, _, _, _, err := decodeKey(it.Key())
		require.NoError(t, err)
		if got != id {
			break
		}
		n++
	}
	return n
}

// panickingUpstreamForTest panics in Subscribe (the embedder's upstream is
// the edge this test is about).
type panickingUpstreamForTest struct{}

func (panickingUpstreamForTest) Subscribe(common.Span, common.Ts, Sink) (Subscription, error) {
	panic("upstream bug")
}

// TestAPanickingUpstreamLeavesNoLockHeld: Store.mu is released by defer
// around Upstream.Subscribe, so a panicking upstream does not wedge every
// later registration and Close.
func TestAPanickingUpstreamLeavesNoLockHeld(t *testing.T) {
	s, err := Open(Options{Upstream: panickingUpstreamForTest{}})
	require.NoError(t, err)
	require.NoError(t, s.Start())
	require.Panics(t, func() {
		_ = s.RegisterDispatcher(common.DispatcherIDFromUint64(1), common.TableSpan(1), 1, NotifierFunc(func(common.Ts, common.Ts) {}))
	})
	require.True(t, s.mu.TryLock(), "Store.mu was released by defer")
	s.mu.Unlock()
	require.NoError(t, s.Close())
}

// TestGCRoundIsOneBatchAndFollowsChange: a GC round writes every due
// deletion in one pebble batch (a tombstone per subscription written on
// its own made every new iterator re-fragment all of them), and only
// subscriptions whose checkpoint moved are scheduled at all: maintenance
// never walks the population.
func TestGCRoundIsOneBatchAndFollowsChange(t *testing.T) {
	// No fresh rows: every row is written to pebble, whose GC this checks.
	env := newTestEnv(t, func(o *Options) { o.GCMinSpan = time.Millisecond; o.FreshBytes = -1 })
	const n = 50
	ms := func(n int64) common.Ts { return common.ComposeTs(n, 0) }
	rs := make([]*recorder, n)
	for i := range n {
		rs[i] = newRecorder()
		require.NoError(t, env.store.RegisterDispatcher(did(uint64(i+1)), common.TableSpan(int64(i+1)), 0, rs[i]))
	}
	for i, sub := range env.up.subs() {
		push(t, sub, ms(30), put("a", ms(5), ms(10)))
		rs[i].waitResolved(t, ms(30))
	}
	env.store.maint.mu.Lock()
	require.Zero(t, env.store.maint.mu.delay.Len(), "no checkpoint moved: nothing scheduled")
	env.store.maint.mu.Unlock()

	for i := range 3 {
		require.NoError(t, env.store.UpdateCheckpoint(did(uint64(i+1)), ms(20)))
	}
	env.store.maint.mu.Lock()
	require.Equal(t, 3, env.store.maint.mu.delay.Len(), "only the subscriptions whose checkpoint moved")
	require.Len(t, env.store.maint.mu.ripe, 3)
	env.store.maint.mu.Unlock()
	for i := 3; i < n; i++ {
		require.NoError(t, env.store.UpdateCheckpoint(did(uint64(i+1)), ms(20)))
	}
	env.store.maintain()
	require.Equal(t, float64(n), testutil.ToFloat64(env.store.metrics.gcRangesDeleted))
	require.Equal(t, 1.0, testutil.ToFloat64(env.store.metrics.gcRounds), "one batch for the whole round")
	for _, sub := range env.up.subs() {
		require.Zero(t, countRaw(t, env.store, sub), "the row below the checkpoint is gone")
	}
	env.store.maintain()
	require.Equal(t, 1.0, testutil.ToFloat64(env.store.metrics.gcRounds), "nothing pending: no round")
}

// holdingUpstreamForTest holds its first Subscribe until released (the
// embedder's upstream is the edge this test is about).
type holdingUpstreamForTest struct {
	fakeUpstreamForTest
	entered, release chan struct{}
	once             sync.Once
}

func (h *holdingUpstreamForTest) Subscribe(span common.Span, startTs common.Ts, sink Sink) (Subscription, error) {
	first := false
	h.once.Do(func() { first = true })
	if first {
		close(h.entered)
		<-h.release
	}
	return h.fakeUpstreamForTest.Subscribe(span, startTs, sink)
}

// TestRegistrationDoesNotHoldTheStoreLockAcrossSubscribe: while the
// upstream takes its time subscribing a span, the store lock is free
// (heartbeats, other registrations and scans go on), and a second
// registration of the same span waits for that subscription and shares it
// instead of subscribing twice.
func TestRegistrationDoesNotHoldTheStoreLockAcrossSubscribe(t *testing.T) {
	up := &holdingUpstreamForTest{entered: make(chan struct{}), release: make(chan struct{})}
	s, err := Open(Options{Upstream: up})
	require.NoError(t, err)
	require.NoError(t, s.Start())
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	var released sync.Once
	release := func() { released.Do(func() { close(up.release) }) }
	t.Cleanup(release)

	first := make(chan error, 1)
	go func() {
		first <- s.RegisterDispatcher(did(1), common.TableSpan(1), 0, newRecorder())
	}()
	<-up.entered // Subscribe of table 1 is in progress
	require.True(t, s.mu.TryLock(), "Store.mu is free while the upstream subscribes")
	s.mu.Unlock()
	require.NoError(t, s.RegisterDispatcher(did(9), common.TableSpan(9), 0, newRecorder()), "another span registers meanwhile")

	waiting := make(chan struct{})
	s.knobs.subscribeWaits = func() { close(waiting) }
	second := make(chan error, 1)
	go func() {
		second <- s.RegisterDispatcher(did(2), common.TableSpan(1), 0, newRecorder())
	}()
	<-waiting // the second registration waits for the first's subscription
	release()
	require.NoError(t, <-first)
	require.NoError(t, <-second)
	a, err := s.Dispatcher(did(1))
	require.NoError(t, err)
	b, err := s.Dispatcher(did(2))
	require.NoError(t, err)
	require.Equal(t, a.SubscriptionID, b.SubscriptionID, "one subscription for the span")
	require.Len(t, up.subs(), 2, "tables 1 and 9, each subscribed once")
}

// TestNotifyIntervalHoldsBackButNeverLosesTheLastAdvance: with a
// NotifyInterval, advances within it are not notified one by one; the
// latest is notified once the interval is up, with no further push.
func TestNotifyIntervalHoldsBackButNeverLosesTheLastAdvance(t *testing.T) {
	env, armed, published := newThrottledEnv(t)
	r := newRecorder()
	require.NoError(t, env.store.RegisterDispatcher(did(1), common.TableSpan(1), 0, r))
	sub := env.up.last(t, common.TableSpan(1))
	push(t, sub, 10)
	require.Equal(t, common.Ts(10), r.next(t).resolved, "the first advance is notified at once")
	require.Equal(t, common.Ts(10), <-published)
	push(t, sub, 20)
	push(t, sub, 30, put("a", 25, 26))
	require.Equal(t, common.Ts(20), <-published) // committed and held back
	require.Equal(t, common.Ts(30), <-published)
	require.Empty(t, r.ch, "advances within the interval are held back")
	for d := range armed { // the flusher armed its timer for the held advance
		if d <= 100*time.Millisecond {
			break
		}
	}
	env.clk.Advance(100 * time.Millisecond)
	n := r.next(t)
	require.Equal(t, common.Ts(30), n.resolved, "the latest advance, once the interval is up")
	require.Equal(t, common.Ts(26), n.maxCommit)
	require.Empty(t, r.ch)
}

// TestNotifyTimesOneCallbackInEightAndCountsEvery: every callback is
// counted; one in notifySampleEvery of each dispatcher is timed, from an
// offset of its own: any notifySampleEvery callbacks in a row hold one
// timed, and which of a dispatcher's callbacks is the first timed is
// spread over the dispatchers (a first callback is slower than the
// others, and timing every dispatcher's first biased the quantiles).
func TestNotifyTimesOneCallbackInEightAndCountsEvery(t *testing.T) {
	firstTimed := make([]int, notifySampleEvery)
	for i := range uint64(8000) {
		off := sampleOffset(common.DispatcherID{Hi: i / 100, Lo: i})
		require.Less(t, off, uint32(notifySampleEvery))
		firstTimed[(notifySampleEvery+1-off)%notifySampleEvery]++ // the callback numbered off+k ≡ 1
	}
	for k, n := range firstTimed {
		require.InDelta(t, 1000, n, 200, "dispatchers whose callback %d (mod %d) is their first timed", k, notifySampleEvery)
	}

	const n = 3 * notifySampleEvery // three of each are timed, whatever its offset
	// The writer adds a batch's callbacks to the counter after they
	// returned: the counter is read once all 2n are in.
	var accounted atomic.Int64
	allAccounted := make(chan struct{})
	env := newTestEnv(t, nil, func(s *Store) {
		s.knobs.accounted = func(notified int) {
			if accounted.Add(int64(notified)) == 2*n {
				close(allAccounted)
			}
		}
	})
	r1, r2 := newRecorder(), newRecorder()
	require.NoError(t, env.store.RegisterDispatcher(did(1), common.TableSpan(1), 0, r1))
	require.NoError(t, env.store.RegisterDispatcher(did(2), common.TableSpan(2), 0, r2))
	for ts := common.Ts(1); ts <= n; ts++ {
		push(t, env.up.last(t, common.TableSpan(1)), ts)
		push(t, env.up.last(t, common.TableSpan(2)), ts)
		r1.waitResolved(t, ts)
		r2.waitResolved(t, ts)
	}
	select {
	case <-allAccounted:
	case <-time.After(10 * time.Second):
		t.Fatalf("%d of %d callbacks accounted", accounted.Load(), 2*n)
	}
	st := env.store.Stats()
	require.Equal(t, uint64(2*n), st.NotifyCount, "every callback counted")
	require.Equal(t, uint64(2*3), env.store.notifyLatency.Count(), "three of each dispatcher's timed")
	require.Positive(t, st.NotifyMax)
}

// TestHandleUpdatesItsRegistrationOnly: a handle moves its registration's
// checkpoint (capped at the resolved-ts, as by ID); once the dispatcher is
// unregistered it fails as the ID would, and stays failed after the ID is
// registered again (the new registration has its own handle).
func TestHandleUpdatesItsRegistrationOnly(t *testing.T) {
	env := newTestEnv(t, nil)
	r := newRecorder()
	require.NoError(t, env.store.RegisterDispatcher(did(1), common.TableSpan(1), 0, r))
	push(t, env.up.last(t, common.TableSpan(1)), 20, put("a", 5, 10))
	r.waitResolved(t, 20)
	h, err := env.store.Handle(did(1))
	require.NoError(t, err)
	require.True(t, h.Valid())
	require.NoError(t, h.UpdateCheckpoint(15))
	st, err := env.store.Dispatcher(did(1))
	require.NoError(t, err)
	require.Equal(t, common.Ts(15), st.Checkpoint)
	require.NoError(t, h.UpdateCheckpoint(1000))
	st, _ = env.store.Dispatcher(did(1))
	require.Equal(t, common.Ts(20), st.Checkpoint, "capped at the resolved-ts")

	require.NoError(t, env.store.UnregisterDispatcher(did(1)))
	require.ErrorIs(t, h.UpdateCheckpoint(20), ErrDispatcherNotFound)
	r2 := newRecorder()
	require.NoError(t, env.store.RegisterDispatcher(did(1), common.TableSpan(1), 0, r2))
	require.ErrorIs(t, h.UpdateCheckpoint(20), ErrDispatcherNotFound, "the old handle is not the new registration's")
	h2, err := env.store.Handle(did(1))
	require.NoError(t, err)
	require.NoError(t, h2.UpdateCheckpoint(5))

	_, err = env.store.Handle(did(9))
	require.ErrorIs(t, err, ErrDispatcherNotFound)
	require.ErrorIs(t, Handle{}.UpdateCheckpoint(1), ErrInvalidArgument)
	require.False(t, Handle{}.Valid())
}

// TestRegisterDispatcherHandleIsTheRegistrationsHandle: the handle that
// RegisterDispatcherHandle returns updates the registration it made, as
// Handle(id) would, and no other; bad arguments are refused as by
// RegisterDispatcher, with no handle.
func TestRegisterDispatcherHandleIsTheRegistrationsHandle(t *testing.T) {
	env := newTestEnv(t, nil)
	r := newRecorder()
	h, err := env.store.RegisterDispatcherHandle(did(1), common.TableSpan(1), 0, r)
	require.NoError(t, err)
	require.True(t, h.Valid())
	push(t, env.up.last(t, common.TableSpan(1)), 20, put("a", 5, 10))
	r.waitResolved(t, 20)
	require.NoError(t, h.UpdateCheckpoint(15))
	st, err := env.store.Dispatcher(did(1))
	require.NoError(t, err)
	require.Equal(t, common.Ts(15), st.Checkpoint)

	require.NoError(t, env.store.UnregisterDispatcher(did(1)))
	require.ErrorIs(t, h.UpdateCheckpoint(20), ErrDispatcherNotFound)
	h2, err := env.store.RegisterDispatcherHandle(did(1), common.TableSpan(1), 0, newRecorder())
	require.NoError(t, err)
	require.ErrorIs(t, h.UpdateCheckpoint(20), ErrDispatcherNotFound, "the old handle is not the new registration's")
	require.NoError(t, h2.UpdateCheckpoint(5))

	h3, err := env.store.RegisterDispatcherHandle(common.DispatcherID{}, common.TableSpan(2), 0, newRecorder())
	require.ErrorIs(t, err, ErrInvalidArgument)
	require.False(t, h3.Valid())
	h3, err = env.store.RegisterDispatcherHandle(did(2), common.TableSpan(2), 0, nil)
	require.ErrorIs(t, err, ErrInvalidArgument)
	require.False(t, h3.Valid())
}

// TestAWriteBatchObservesItsLargestLagOnce: resolved_lag_seconds gets one
// sample per write batch that advances, the lag of its oldest resolved-ts,
// and notifications_total counts every callback of the batch.
func TestAWriteBatchObservesItsLargestLagOnce(t *testing.T) {
	env := newTestEnv(t, nil)
	r1, r2 := newRecorder(), newRecorder()
	require.NoError(t, env.store.RegisterDispatcher(did(1), common.TableSpan(1), 0, r1))
	require.NoError(t, env.store.RegisterDispatcher(did(2), common.TableSpan(2), 0, r2))
	subs := map[int64]*subscription{}
	env.store.mu.RLock()
	for sub := range env.store.mu.subs.All() {
		subs[sub.span.Table()] = sub
	}
	env.store.mu.RUnlock()
	require.Len(t, subs, 2)
	now := env.clk.Now()
	behind := func(d time.Duration) common.Ts { return common.ComposeTs(now.Add(-d).UnixMilli(), 0) }
	samples := func() uint64 {
		var m dto.Metric
		require.NoError(t, env.store.metrics.resolvedLag.Write(&m))
		return m.GetHistogram().GetSampleCount()
	}
	before, notified := samples(), testutil.ToFloat64(env.store.metrics.notifications)
	var m dto.Metric
	require.NoError(t, env.store.metrics.resolvedLag.Write(&m))
	sumBefore := m.GetHistogram().GetSampleSum()

	require.NoError(t, env.store.apply([]writeEvent{{sub: subs[1], resolved: behind(3 * time.Second)}, {sub: subs[2], resolved: behind(time.Second)}}))
	r1.waitResolved(t, behind(3*time.Second))
	r2.waitResolved(t, behind(time.Second))
	require.Equal(t, before+1, samples(), "one sample for the batch")
	require.NoError(t, env.store.metrics.resolvedLag.Write(&m))
	require.InDelta(t, 3.0, m.GetHistogram().GetSampleSum()-sumBefore, 1e-9, "the batch's largest lag")
	require.Equal(t, notified+2, testutil.ToFloat64(env.store.metrics.notifications))

	// A batch without an advance observes nothing.
	require.NoError(t, env.store.apply([]writeEvent{{sub: subs[1], resolved: behind(3 * time.Second)}}))
	require.Equal(t, before+1, samples())
}

// TestGCTargetFollowsTheMinimumCheckpointWhateverTheOrder: the GC target
// is only recomputed when the last subscriber at or below it passes it
// (updateCheckpoint, atTarget). Random checkpoint advances, removals and
// arrivals of dispatchers sharing a subscription must leave it where a
// recompute after every step would: the largest minimum checkpoint seen so
// far, with atTarget the number of subscribers at or below it.
func TestGCTargetFollowsTheMinimumCheckpointWhateverTheOrder(t *testing.T) {
	env := newTestEnv(t, nil)
	span := common.TableSpan(1)
	ckpt := map[common.DispatcherID]common.Ts{}
	rec := newRecorder()
	for i := range uint64(4) {
		notify := func(common.Ts, common.Ts) {}
		if i == 0 {
			notify = rec.Notify
		}
		require.NoError(t, env.store.RegisterDispatcher(did(i+1), span, 10, NotifierFunc(notify)))
		ckpt[did(i+1)] = 10
	}
	push(t, env.up.last(t, span), 10_000)
	// Checkpoints are capped at the resolved-ts: wait until it is in.
	rec.waitResolved(t, 10_000)
	env.store.mu.RLock()
	sb, _ := env.store.mu.dispatchers.Lookup(did(1))
	sub := sb.sub
	env.store.mu.RUnlock()
	gcTarget := func() common.Ts {
		sub.mu.Lock()
		defer sub.mu.Unlock()
		return sub.mu.gcTarget
	}
	rng := rand.New(rand.NewPCG(7, 11))
	var want common.Ts = 10
	next := uint64(4)
	for step := range 2000 {
		ids := slices.SortedFunc(maps.Keys(ckpt), func(a, b common.DispatcherID) int { return cmp.Compare(a.Lo, b.Lo) })
		id := ids[rng.IntN(len(ids))]
		switch {
		case len(ids) > 1 && rng.IntN(50) == 0:
			require.NoError(t, env.store.UnregisterDispatcher(id))
			delete(ckpt, id)
		case len(ids) < 6 && rng.IntN(50) == 0:
			// A new dispatcher joins at the target or just above it (not
			// below: the low watermark follows the target).
			next++
			start := want + common.Ts(rng.IntN(2))
			require.NoError(t, env.store.RegisterDispatcher(did(next), span, start, NotifierFunc(func(common.Ts, common.Ts) {})))
			ckpt[did(next)] = start
		default:
			// Often to the value another holds, so ties at the minimum occur.
			ts := ckpt[id] + common.Ts(rng.IntN(3))
			require.NoError(t, env.store.UpdateCheckpoint(id, ts))
			ckpt[id] = max(ckpt[id], ts)
		}
		want = max(want, slices.Min(slices.Collect(maps.Values(ckpt))))
		require.Equal(t, want, gcTarget(), "step %d", step)
		// atTarget is exact, not a bound: too high would skip a
		// recompute the target needs, too low recompute for nothing.
		at := 0
		for _, c := range ckpt {
			if c <= want {
				at++
			}
		}
		sub.mu.Lock()
		got := int(sub.mu.atTarget)
		sub.mu.Unlock()
		require.Equal(t, at, got, "step %d: subscribers at or below the target", step)
	}
}

// newThrottledEnv is a test store with a NotifyInterval of 100 ms whose
// knobs report each publish (published) and each arming of the throttle's
// timer (armed: never blocking the flusher, which Close waits for).
func newThrottledEnv(t *testing.T) (*testEnv, <-chan time.Duration, <-chan common.Ts) {
	armed := make(chan time.Duration, 16)
	published := make(chan common.Ts, 16)
	env := newTestEnv(t, func(o *Options) { o.NotifyInterval = 100 * time.Millisecond }, func(s *Store) {
		s.knobs.published = func(ts common.Ts) { published <- ts }
		s.knobs.throttleArmed = func(d time.Duration) {
			select {
			case armed <- d:
			default:
			}
		}
	})
	return env, armed, published
}

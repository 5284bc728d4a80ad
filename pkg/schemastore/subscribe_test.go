package schemastore

import (
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
)

func TestSubscribeDeliversAdvancesAndCancelStops(t *testing.T) {
	m := newMemory(t, 5)
	var a, b []common.Ts
	cancelA := m.Subscribe(func(ts common.Ts) {
		// Callbacks may read the store: no store lock is held while they run.
		r, _ := m.TableState(1)
		require.Equal(t, ts, r)
		a = append(a, ts)
	})
	cancelB := m.Subscribe(func(ts common.Ts) { b = append(b, ts) })
	defer cancelB()

	require.NoError(t, m.AdvanceResolvedTs(6))
	cancelA()
	cancelA() // idempotent
	require.NoError(t, m.AdvanceResolvedTs(7))
	require.Equal(t, []common.Ts{6}, a)
	require.Equal(t, []common.Ts{6, 7}, b)

	// A subscription does not replay the frontier it starts at.
	var c []common.Ts
	cancelC := m.Subscribe(func(ts common.Ts) { c = append(c, ts) })
	defer cancelC()
	require.NoError(t, m.AdvanceResolvedTs(7))
	require.Empty(t, c)
	require.NoError(t, m.AdvanceResolvedTs(8))
	require.Equal(t, []common.Ts{8}, c)

	// A nil callback registers nothing, and its cancel is harmless.
	m.Subscribe(nil)()
	m.mu.RLock()
	require.Len(t, m.mu.subs, 2)
	m.mu.RUnlock()
}

// An advance overtaken by a later one reaches the subscriber late; it must be
// dropped so each subscriber sees strictly increasing frontiers.
func TestSubscriberSkipsStaleFrontier(t *testing.T) {
	var seen []common.Ts
	s := &subscriber{fn: func(ts common.Ts) { seen = append(seen, ts) }}
	s.mu.last = 10
	s.notify(10)
	s.notify(20)
	s.notify(15)
	s.notify(21)
	s.stop(nil)
	s.notify(30)
	require.Equal(t, []common.Ts{20, 21}, seen)
}

// cancel must wait for a callback that is already running, so that once it
// returns the subscriber may free whatever the callback touches.
func TestCancelWaitsForRunningCallback(t *testing.T) {
	m := newMemory(t, 0)
	waiting := make(chan struct{})
	m.knobs.stopWaits = func() { close(waiting) }
	entered := make(chan struct{})
	release := make(chan struct{})
	var releaseOnce sync.Once
	releaseCallback := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(releaseCallback) // a failed run releases the callback rather than hanging
	var mu sync.Mutex
	var events []string
	record := func(e string) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}
	cancel := m.Subscribe(func(ts common.Ts) {
		close(entered)
		<-release
		record("callback returns")
	})

	advanced := make(chan error, 1)
	go func() { advanced <- m.AdvanceResolvedTs(1) }()
	<-entered

	cancelled := make(chan struct{})
	go func() {
		cancel()
		record("cancel returns")
		close(cancelled)
	}()
	// cancel must find the callback running and wait for it: the hook fires
	// exactly then. A cancel that did not wait would never fire it and would
	// return first.
	select {
	case <-waiting:
	case <-cancelled:
		t.Fatal("cancel returned while the callback was running")
	}
	select {
	case <-cancelled:
		t.Fatal("cancel returned while the callback was running")
	default:
	}
	releaseCallback()
	<-cancelled
	require.NoError(t, <-advanced)
	require.Equal(t, []string{"callback returns", "cancel returns"}, events)

	// And no further calls: the callback would close entered twice and panic.
	require.NoError(t, m.AdvanceResolvedTs(2))
}

// With an advancing goroutine racing the cancel, no callback may start after
// cancel has returned.
func TestNoCallbackAfterCancelUnderConcurrentAdvance(t *testing.T) {
	m := newMemory(t, 0)
	var cancelReturned atomic.Bool
	var calls, lateCalls atomic.Int64
	started := make(chan struct{})
	cancel := m.Subscribe(func(ts common.Ts) {
		if cancelReturned.Load() {
			lateCalls.Add(1)
		}
		if calls.Add(1) == 3 {
			close(started)
		}
	})

	moreAfterCancel := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		ts := common.Ts(0)
		advance := func() {
			ts++
			assert.NoError(t, m.AdvanceResolvedTs(ts))
		}
		// Advance until told the cancel has returned, then 100 more times.
		for {
			select {
			case <-moreAfterCancel:
				for range 100 {
					advance()
				}
				return
			default:
				advance()
			}
		}
	}()

	<-started
	cancel()
	cancelReturned.Store(true)
	n := calls.Load()
	close(moreAfterCancel)
	<-done

	require.GreaterOrEqual(t, n, int64(3))
	require.Zero(t, lateCalls.Load(), "callback ran after cancel returned")
	require.Equal(t, n, calls.Load())
	require.Greater(t, m.ResolvedTs(), common.Ts(100), "the advancer kept going after the cancel")
}

// Readers, a writer and a subscriber run concurrently; every read must be a
// consistent snapshot of a history the test can predict exactly.
func TestConcurrentReadersAndWriter(t *testing.T) {
	const (
		tables = 4
		maxTs  = 2000
	)
	// Table t has a DDL at every commit-ts divisible by t+2.
	hasDDL := func(table int64, ts common.Ts) bool { return uint64(ts)%uint64(table+2) == 0 }

	m := newMemory(t, 0)
	var notified []common.Ts
	cancel := m.Subscribe(func(ts common.Ts) { notified = append(notified, ts) })

	writerDone := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(writerDone)
		for ts := common.Ts(1); ts <= maxTs; ts++ {
			for table := range int64(tables) {
				if hasDDL(table, ts) {
					assert.NoError(t, m.AddDDL(DDL{TableID: table, CommitTs: ts}))
				}
			}
			// Some DDLs are added a step ahead of the frontier.
			if ts%3 != 0 {
				assert.NoError(t, m.AdvanceResolvedTs(ts))
			}
		}
		assert.NoError(t, m.AdvanceResolvedTs(maxTs))
	})

	for reader := range 4 {
		wg.Go(func() {
			table := int64(reader % tables)
			var buf []DDL
			prevR := common.Ts(0)
			for {
				select {
				case <-writerDone:
					return
				default:
				}
				r, last := m.TableState(table)
				if !assert.GreaterOrEqual(t, r, prevR, "frontier went back") {
					return
				}
				prevR = r
				var err error
				buf, err = m.FetchDDLs(table, 0, r, buf[:0])
				if !assert.NoError(t, err) {
					return
				}
				var want common.Ts
				for ts := r; ts > 0; ts-- {
					if hasDDL(table, ts) {
						want = ts
						break
					}
				}
				assert.Equal(t, want, last, "table %d at %d", table, r)
				assert.Len(t, buf, int(uint64(r)/uint64(table+2)), "table %d at %d", table, r)
				assert.True(t, slices.IsSortedFunc(buf, func(a, b DDL) int { return int(a.CommitTs) - int(b.CommitTs) }))
				if len(buf) > 0 {
					assert.Equal(t, last, buf[len(buf)-1].CommitTs)
				}
			}
		})
	}
	wg.Wait()
	cancel()

	require.Equal(t, common.Ts(maxTs), m.ResolvedTs())
	require.NotEmpty(t, notified)
	require.True(t, slices.IsSorted(notified))
	require.Equal(t, common.Ts(maxTs), notified[len(notified)-1])
	require.Len(t, notified, len(slices.Compact(slices.Clone(notified))), "no duplicates")
}

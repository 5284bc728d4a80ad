package eventservice

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/schemastore"
	"github.com/cdcflow/eventservice/pkg/upstream"
)

// newNotifyWorld starts a service with one preparation worker and one scan
// worker on the real store, the in-memory schema store (frontier far
// ahead) and the in-process transport, with n dispatchers registered from
// 10 and hand-shaken (idle) when it returns. The service and the store run
// on a fake clock that the test never moves, so no ticker of theirs fires
// while allocations are counted. hk's prepared hook is taken.
func newNotifyWorld(t *testing.T, n int, hk hooks) (*Service, []*dispatcher) {
	t.Helper()
	clk := clock.NewFake(time.Unix(1_000_000, 0))
	up := upstream.NewManual()
	store, err := eventstore.Open(eventstore.Options{Upstream: up, Clock: clk})
	require.NoError(t, err)
	require.NoError(t, store.Start())
	t.Cleanup(func() { require.NoError(t, store.Close()) })
	schema, err := schemastore.NewMemory(schemastore.MemoryOptions{InitialResolvedTs: 1 << 40})
	require.NoError(t, err)
	tr, err := messaging.NewInProcess(messaging.InProcessOptions{Capacity: 1 << 16})
	require.NoError(t, err)
	t.Cleanup(tr.Close)
	_, err = tr.Register(testTarget)
	require.NoError(t, err)
	svc, err := New(Options{Store: store, Schema: schema, Transport: tr, Clock: clk, Logger: zap.NewNop(),
		PrepareWorkers: 1, ScanWorkers: 1, ScanQueueSize: 1})
	require.NoError(t, err)
	handshaken := make(chan struct{})
	var prepared atomic.Int64
	hk.prepared = func(*session, prepareOutcome) {
		if prepared.Add(1) == int64(n) {
			close(handshaken)
		}
	}
	svc.knobs = hk.knobs()
	ds := make([]*dispatcher, n)
	for i := range n {
		id := common.DispatcherIDFromUint64(uint64(i + 1))
		require.NoError(t, svc.Register(context.Background(), messaging.RegisterRequest{Dispatcher: id, Registration: 1,
			Span: common.TableSpan(int64(i + 1)), StartTs: 10, Target: testTarget}))
		ds[i] = dispatcherForTest(svc, id)
	}
	require.NoError(t, svc.Start())
	t.Cleanup(func() { require.NoError(t, svc.Close()) })
	<-handshaken
	for _, d := range ds {
		st, _ := d.session.Load().sched.load()
		require.Equal(t, stateIdle.String(), st.String())
	}
	return svc, ds
}

// TestANotificationAllocatesNothingWhetherItEnqueuesOrIsAbsorbed: the
// store's callback allocates nothing, neither when it wakes an idle
// session (it moves the session to the preparation queue) nor when the
// pipeline is saturated and the notification is absorbed by work already
// queued. At a million dispatchers notified per second, one allocation a
// call would be a million a second. testing.AllocsPerRun counts every
// allocation of the process, so each case first brings every worker to a
// stop: only the notifications run while it counts.
func TestANotificationAllocatesNothingWhetherItEnqueuesOrIsAbsorbed(t *testing.T) {
	const runs = 1000

	t.Run("an idle session is enqueued", func(t *testing.T) {
		// The preparation worker is held in the preparation of a first
		// session, so the measured notifications each find an idle
		// session, enqueue it, and leave it queued: one session per call
		// (AllocsPerRun calls once more than runs).
		const n = runs + 2
		var hold sync.Once
		armed := atomic.Bool{}
		held, release := make(chan struct{}), make(chan struct{})
		svc, ds := newNotifyWorld(t, n, hooks{beforePrepare: func(*session) {
			if armed.Load() {
				hold.Do(func() { close(held); <-release })
			}
		}})
		t.Cleanup(func() { close(release) })
		armed.Store(true)
		ds[0].Notify(20, 5)
		<-held

		next := 1
		allocs := testing.AllocsPerRun(runs, func() {
			ds[next].Notify(20, 5)
			next++
		})
		require.Equal(t, n, next)
		for _, d := range ds[1:] {
			st, _ := d.session.Load().sched.load()
			require.Equal(t, statePrepareQueued.String(), st.String(), "every measured call enqueued its session")
		}
		require.Equal(t, n-1, svc.prepQueues[0].len())
		require.Zero(t, allocs, "a notification that enqueues allocated")
	})

	t.Run("a saturated pipeline absorbs it", func(t *testing.T) {
		// As BenchmarkNotifySaturated: every dispatcher has rows above its
		// progress, the scan worker is held, the scan channel is full,
		// the preparation worker waits for room, and everyone else is
		// queued.
		const n = 1000
		release, full := make(chan struct{}), make(chan struct{}, 1)
		svc, ds := newNotifyWorld(t, n, hooks{
			beforeScan: func(*session) { <-release },
			scanChannelFull: func(*session) {
				select {
				case full <- struct{}{}:
				default:
				}
			},
		})
		t.Cleanup(func() { close(release) })
		for _, d := range ds {
			d.Notify(20, 15)
		}
		<-full
		queued := svc.prepQueues[0].len()
		require.Positive(t, queued)

		i := 0
		allocs := testing.AllocsPerRun(runs, func() {
			ds[i%n].Notify(common.Ts(100+i/n), 15)
			i++
		})
		require.Equal(t, queued, svc.prepQueues[0].len(), "the notifications were absorbed")
		require.Len(t, svc.scanCh, 1, "the scan channel is still full")
		require.Zero(t, allocs, "an absorbed notification allocated")
	})
}

package eventservice

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

// TestResetDiscardsOldEpoch resets a dispatcher while its old epoch is
// queued, preparing and scanning: nothing of the old epoch is sent after the
// reset, and the new epoch starts with a handshake at its start-ts and
// delivers exactly the rows above it.
func TestResetDiscardsOldEpoch(t *testing.T) {
	for _, stage := range []string{"queued", "preparing", "scanning"} {
		t.Run(stage, func(t *testing.T) {
			var prepGate, scanGate *gateForTest
			// oldDone is told when the old epoch's owner (a preparation or
			// a scan held across the reset) finishes with it.
			oldDone := make(chan struct{}, 1)
			isOld := func(s *session) bool { return s.d.id == common.DispatcherIDFromUint64(1) && s.epoch == 1 }
			signal := func(s *session) {
				if isOld(s) {
					select {
					case oldDone <- struct{}{}:
					default:
					}
				}
			}
			hk := hooks{
				prepared: func(s *session, _ prepareOutcome) { signal(s) },
				scanned:  func(s *session, _ scanOutcome) { signal(s) },
			}
			switch stage {
			case "queued":
				prepGate = newGate(isDispatcher(99)) // a blocker ahead in the queue
				hk.beforePrepare = prepGate.hook
			case "preparing":
				prepGate = newGate(isDispatcher(1))
				hk.beforePrepare = prepGate.hook
			case "scanning":
				scanGate = newGate(isDispatcher(1))
				hk.beforeScan = scanGate.hook
			}
			gates := []*gateForTest{}
			for _, g := range []*gateForTest{prepGate, scanGate} {
				if g != nil {
					gates = append(gates, g)
				}
			}
			h := newHarness(t, func(o *Options) { o.PrepareWorkers = 1 }, hk, gates...)
			h.advanceSchema(1 << 40)
			obs := storeObserver(t, h, 1)
			h.push(1, 40, row("a", 15, 20), row("b", 25, 30))
			waitTs(obs, 40)
			if stage == "queued" {
				h.register(99, 10)
				<-prepGate.held
			}
			id := h.register(1, 10)
			switch stage {
			case "preparing":
				<-prepGate.held
			case "scanning":
				<-scanGate.held
			case "queued":
				s := h.dispatcher(id).session.Load()
				st, _ := s.sched.load()
				require.Equal(t, statePrepareQueued, st)
			}
			old := h.dispatcher(id).session.Load()
			require.NoError(t, h.reset(id, 2, 25))
			st, _ := old.sched.load()
			require.Equal(t, stateRemoved, st)
			require.False(t, old.queued, "a reset session leaves its queue at once")
			select {
			case <-oldDone: // an earlier owner's signal (the preparation before a held scan)
			default:
			}
			for _, g := range gates {
				g.open()
			}
			es := h.check.waitEpochResolved(id, 2, 40)
			require.Equal(t, common.Ts(25), es.startTs)
			require.Equal(t, []string{"b"}, keys(es.rows))
			if stage != "queued" {
				// The held owner has finished with the old session, so
				// whatever it was going to send is in the inbox now.
				<-oldDone
			}
			h.check.drain()
			h.check.mu.Lock()
			hist := h.check.history[id]
			stale := h.check.stale[id]
			h.check.mu.Unlock()
			require.Zero(t, stale, "nothing of the old epoch arrived after the new handshake")
			for _, e := range hist {
				if e.epoch == 1 {
					require.Empty(t, e.rows, "the old epoch's scan was discarded")
				}
			}
			if stage != "scanning" {
				require.Len(t, hist, 1, "the old epoch never got as far as a handshake")
			}
		})
	}
}

// TestConcurrentResetsHighestEpochWins: of concurrent resets, the highest
// epoch is the one that stays; lower ones get messaging.ErrStaleEpoch or are
// superseded.
func TestConcurrentResetsHighestEpochWins(t *testing.T) {
	h := newHarness(t, nil, hooks{})
	id := h.register(1, 10)
	var wg sync.WaitGroup
	errs := make([]error, 22)
	for e := uint64(2); e <= 21; e++ {
		wg.Go(func() { errs[e] = h.reset(id, e, common.Ts(10+e)) })
	}
	wg.Wait()
	for e, err := range errs {
		if err != nil {
			require.ErrorIs(t, err, messaging.ErrStaleEpoch, "epoch %d", e)
		}
	}
	s := h.dispatcher(id).session.Load()
	require.Equal(t, uint64(21), s.epoch)
	require.Equal(t, common.Ts(31), s.own.startTs)
	require.ErrorIs(t, h.reset(id, 21, 50), messaging.ErrStaleEpoch)
	h.check.waitEpochResolved(id, 21, 31)

	// The same, in a fixed order: a lower epoch arriving after a higher one
	// is refused and changes nothing.
	require.NoError(t, h.reset(id, 30, 40))
	for e := uint64(22); e < 30; e++ {
		require.ErrorIs(t, h.reset(id, e, 45), messaging.ErrStaleEpoch)
	}
	s = h.dispatcher(id).session.Load()
	require.Equal(t, uint64(30), s.epoch)
	require.Equal(t, common.Ts(40), s.own.startTs)
	h.check.waitEpochResolved(id, 30, 40)
}

// TestRemoveRacingNotifyAndScan: a dispatcher removed while its scan runs
// and while the store's callback fires sends nothing afterwards; after
// Remove returns its notifier is inert (nothing is queued, the session
// stays removed); the ID can be reused.
func TestRemoveRacingNotifyAndScan(t *testing.T) {
	scanGate := newGate(isDispatcher(1))
	scanDone := make(chan struct{}, 1)
	hk := hooks{beforeScan: scanGate.hook, scanned: func(s *session, _ scanOutcome) {
		if s.d.id == common.DispatcherIDFromUint64(1) && s.epoch == 1 {
			select {
			case scanDone <- struct{}{}:
			default:
			}
		}
	}}
	h := newHarness(t, nil, hk, scanGate)
	h.advanceSchema(1 << 40)
	id := h.register(1, 10)
	h.check.waitResolved(id, 10)
	d := h.dispatcher(id)
	h.push(1, 40, row("a", 15, 20))
	<-scanGate.held
	var wg sync.WaitGroup
	wg.Go(func() {
		for range 10_000 {
			d.Notify(40, 20) // the store's callback racing the removal
		}
	})
	require.NoError(t, h.remove(id))
	wg.Wait()
	old := d.session.Load()
	for range 1000 {
		d.Notify(50, 45) // after Remove: inert
	}
	st, _ := old.sched.load()
	require.Equal(t, stateRemoved, st)
	require.False(t, old.queued)
	require.Zero(t, h.svc.Stats().PendingPrepare, "a removed dispatcher's notifications queue nothing")
	select {
	case <-scanDone: // an earlier scan's signal
	default:
	}
	scanGate.open()
	<-scanDone // the held scan finished with the removed session
	require.ErrorIs(t, h.remove(id), messaging.ErrUnknownDispatcher)
	// Re-register the same ID: a fresh dispatcher (any epoch; 5 here).
	require.NoError(t, h.registerOn(id, 1, 40, testTarget))
	h.check.waitEpochResolved(id, 1, 40)
	h.check.mu.Lock()
	defer h.check.mu.Unlock()
	for _, e := range h.check.history[id] {
		require.Empty(t, e.rows, "the removed dispatcher's scan sent nothing")
	}
	require.Zero(t, h.check.stale[id], "nothing of the removed epoch arrived after the new handshake")
}

// TestNoLostWakeupAfterRefusals: the target refuses every send while data
// arrives and the store notifies for the last time; after the target
// recovers every dispatcher reaches the final resolved-ts with no further
// notification.
func TestNoLostWakeupAfterRefusals(t *testing.T) {
	h := newHarness(t, nil, hooks{})
	h.advanceSchema(1 << 40)
	const n = 20
	h.tr.refuse.Store(true)
	ids := make([]common.DispatcherID, n)
	obs := make([]chan common.Ts, n)
	for i := range ids {
		ids[i] = h.register(uint64(i+1), 10)
		obs[i] = storeObserver(t, h, uint64(i+1))
	}
	for i := range ids {
		h.push(uint64(i+1), 40, row("a", 15, 20), row("b", 25, 30))
	}
	for i := range obs {
		waitTs(obs[i], 40) // the last notification has been delivered
	}
	<-h.tr.refused
	notifications := h.svc.Stats().Notifications
	h.tr.refuse.Store(false)
	for _, id := range ids {
		es := h.check.waitResolved(id, 40)
		require.Equal(t, []string{"a", "b"}, keys(es.rows))
	}
	require.Equal(t, notifications, h.svc.Stats().Notifications, "recovery needed no notification")
	require.Positive(t, testutilCounter(h.svc.metrics.backoffs))
}

// TestCongestedTargetSlowsOnlyItsOwnDispatchers: one target refuses; the
// other target's dispatchers keep flowing.
func TestCongestedTargetSlowsOnlyItsOwnDispatchers(t *testing.T) {
	h := newHarness(t, nil, hooks{})
	h.advanceSchema(1 << 40)
	const busy messaging.Target = "busy"
	_, err := h.inproc.Register(busy)
	require.NoError(t, err)
	h.tr.refuseOnly(busy)
	for i := uint64(1); i <= 10; i++ {
		require.NoError(t, h.registerOn(common.DispatcherIDFromUint64(100+i), int64(100+i), 10, busy))
		h.push(100+i, 40, row("x", 15, 20))
	}
	ids := make([]common.DispatcherID, 10)
	for i := range ids {
		ids[i] = h.register(uint64(i+1), 10)
		h.push(uint64(i+1), 40, row("a", 15, 20))
	}
	for _, id := range ids {
		es := h.check.waitResolved(id, 40)
		require.Equal(t, []string{"a"}, keys(es.rows))
	}
	require.Positive(t, h.svc.Stats().BackingOff+int(testutilCounter(h.svc.metrics.backoffs)))
}

// TestHeartbeatDrivesStoreCheckpoint: heartbeats are epoch-filtered,
// monotonic, capped at what was sent, and reach the store when rows lie
// below them (storeNeedsCheckpoint).
func TestHeartbeatDrivesStoreCheckpoint(t *testing.T) {
	h := newHarness(t, nil, hooks{})
	h.advanceSchema(1 << 40)
	id := h.register(1, 10)
	h.push(1, 40, row("a", 15, 20))
	h.check.waitResolved(id, 40)
	require.NoError(t, h.heartbeat(id, 1, 30))
	st, err := h.store.Dispatcher(id)
	require.NoError(t, err)
	require.Equal(t, common.Ts(30), st.Checkpoint, "the row at 20 lies below it")
	require.NoError(t, h.heartbeat(id, 1, 20), "a lower checkpoint is ignored")
	require.NoError(t, h.heartbeat(id, 1, 1000), "capped at what was sent")
	snap, err := h.svc.Inspect(id)
	require.NoError(t, err)
	require.Equal(t, common.Ts(40), snap.Checkpoint)
	st, _ = h.store.Dispatcher(id)
	require.Equal(t, common.Ts(30), st.Checkpoint, "no row above 30: the store keeps 30, which collects what 40 would")
	// A row past the store's checkpoint: the next checkpoint past it
	// reaches the store, capped as ever.
	h.push(1, 60, row("b", 45, 50))
	h.check.waitResolved(id, 60)
	require.NoError(t, h.heartbeat(id, 1, 1000))
	st, _ = h.store.Dispatcher(id)
	require.Equal(t, common.Ts(60), st.Checkpoint)
	require.ErrorIs(t, h.heartbeat(id, 2, 40), messaging.ErrStaleEpoch)
	require.ErrorIs(t, h.heartbeat(common.DispatcherIDFromUint64(9), 1, 40), messaging.ErrUnknownDispatcher)

	// A reset below the store checkpoint re-registers in the store, which
	// subscribes the span afresh from the new start-ts (the old
	// subscription may have collected those rows). The manual upstream
	// does not replay by itself, so the test replays what the upstream
	// would; the old, idle subscription refuses the repeat.
	require.NoError(t, h.reset(id, 2, 15))
	require.NoError(t, h.up.WaitLive(context.Background(), common.TableSpan(1), 2))
	require.Equal(t, 2, h.up.SubscribeCount(common.TableSpan(1)))
	err = h.up.Push(context.Background(), common.TableSpan(1), eventstore.Batch{Rows: []common.Row{row("a", 15, 20)}, ResolvedTs: 40})
	require.ErrorIs(t, err, eventstore.ErrRowBeforeResolved)
	es := h.check.waitEpochResolved(id, 2, 40)
	require.Equal(t, []string{"a"}, keys(es.rows))
	// The new store registration takes the heartbeats (the service's
	// handle of the old one was dropped with it).
	require.NoError(t, h.heartbeat(id, 2, 35))
	st, err = h.store.Dispatcher(id)
	require.NoError(t, err)
	require.Equal(t, common.Ts(35), st.Checkpoint)
}

// TestResetReRegistrationFailureRetries: when the store cannot
// re-register a reset dispatcher (the upstream refuses the subscription),
// the reset stands and the control plane's registrar retries with the
// back-off, instead of the new epoch being stranded.
func TestResetReRegistrationFailureRetries(t *testing.T) {
	retried := make(chan struct{}, 1)
	h := newHarness(t, nil, hooks{beforeReRegister: func(*dispatcher) {
		select {
		case retried <- struct{}{}:
		default:
		}
	}})
	h.advanceSchema(1 << 40)
	id := h.deliveredAndCheckpointed()
	boom := errors.New("upstream refuses subscriptions")
	h.up.SetSubscribeErr(boom)
	require.NoError(t, h.reset(id, 2, 15))
	snap, err := h.svc.Inspect(id)
	require.NoError(t, err)
	require.True(t, snap.NeedsStore, "the re-registration failed and is outstanding")
	<-retried // the registrar retried (and failed again, or not: either way it goes on)
	h.up.SetSubscribeErr(nil)
	require.NoError(t, h.up.WaitLive(context.Background(), common.TableSpan(1), 2))
	_ = h.up.Push(context.Background(), common.TableSpan(1), eventstore.Batch{Rows: []common.Row{row("a", 15, 20)}, ResolvedTs: 40})
	es := h.check.waitEpochResolved(id, 2, 40)
	require.Equal(t, []string{"a"}, keys(es.rows))
}

// TestCloseRacingReRegistrationLeavesNoStoreRegistration: a reset below
// the checkpoint whose store re-registration failed leaves it to the
// registrar. If Close unregisters every dispatcher after the registrar's
// retry began but before it takes the dispatcher's lock, the retry must not
// register it again: no store registration (and its upstream subscription
// and rows) outlives Close. (A re-registration that Reset itself performs
// holds the same lock as Close's unregistration, so it cannot interleave.)
func TestCloseRacingReRegistrationLeavesNoStoreRegistration(t *testing.T) {
	var armed atomic.Bool
	held, release := make(chan struct{}), make(chan struct{})
	hk := hooks{beforeReRegister: func(*dispatcher) {
		if armed.CompareAndSwap(true, false) {
			close(held)
			<-release
		}
	}}
	unregistered := make(chan struct{})
	hk.closeUnregistered = func() { close(unregistered) }
	h := newHarness(t, nil, hk)
	defer func() {
		select {
		case <-release:
		default:
			close(release) // a failed run must not leave the registrar held
		}
	}()
	h.advanceSchema(1 << 40)
	id := h.deliveredAndCheckpointed()
	h.up.SetSubscribeErr(errors.New("upstream refuses subscriptions"))
	armed.Store(true)
	require.NoError(t, h.reset(id, 2, 15)) // below the checkpoint: re-register, which fails
	<-held
	h.up.SetSubscribeErr(nil) // the held retry would now succeed
	closed := make(chan error, 1)
	go func() { closed <- h.svc.Close() }()
	<-unregistered
	close(release) // the held retry now runs, after the unregistration
	require.NoError(t, <-closed)
	_, err := h.store.Dispatcher(id)
	require.ErrorIs(t, err, eventstore.ErrDispatcherNotFound)
}

// TestRemoveAfterFailedReRegistration: a dispatcher whose re-registration
// failed is not in the store; removing it succeeds all the same.
func TestRemoveAfterFailedReRegistration(t *testing.T) {
	h := newHarness(t, nil, hooks{})
	h.advanceSchema(1 << 40)
	id := h.deliveredAndCheckpointed()
	h.up.SetSubscribeErr(errors.New("upstream refuses subscriptions"))
	require.NoError(t, h.reset(id, 2, 15)) // the re-registration failed: the store no longer knows the dispatcher
	_, err := h.store.Dispatcher(id)
	require.ErrorIs(t, err, eventstore.ErrDispatcherNotFound)
	require.NoError(t, h.remove(id))
	require.ErrorIs(t, h.remove(id), messaging.ErrUnknownDispatcher)
}

func TestBadInputGetsTypedErrors(t *testing.T) {
	h := newHarness(t, nil, hooks{})
	ctx := context.Background()
	good := messaging.RegisterRequest{Dispatcher: common.DispatcherIDFromUint64(1), Registration: 7, Span: common.TableSpan(1), StartTs: 1, Target: testTarget}
	bad := []messaging.RegisterRequest{
		{Registration: 7, Span: common.TableSpan(1), Target: testTarget},
		{Dispatcher: good.Dispatcher, Span: common.TableSpan(1), Target: testTarget},
		{Dispatcher: good.Dispatcher, Registration: 7, Span: common.Span{TableID: 1, StartKey: []byte("b"), EndKey: []byte("a")}, Target: testTarget},
		{Dispatcher: good.Dispatcher, Registration: 7, Span: common.TableSpan(1)},
	}
	for _, req := range bad {
		require.ErrorIs(t, h.svc.Register(ctx, req), messaging.ErrInvalidRequest, "%+v", req)
	}
	err := h.svc.Register(ctx, messaging.RegisterRequest{Span: common.Span{TableID: -1}})
	require.ErrorIs(t, err, common.ErrInvalidSpan, "every problem is reported, joined")
	require.ErrorIs(t, err, messaging.ErrInvalidRequest)
	h.check.expect(good.Dispatcher, good.Registration)
	require.NoError(t, h.svc.Register(ctx, good))
	h.regs[good.Dispatcher] = good.Registration
	require.NoError(t, h.svc.Register(ctx, good), "a repeated request is accepted")
	other := good
	other.Registration = 8
	require.ErrorIs(t, h.svc.Register(ctx, other), messaging.ErrDispatcherExists)
	other = good
	other.StartTs = 2
	require.ErrorIs(t, h.svc.Register(ctx, other), messaging.ErrDispatcherExists, "the same registration asking for something else")
	unknown := common.DispatcherIDFromUint64(42)
	require.ErrorIs(t, h.reset(unknown, 2, 1), messaging.ErrUnknownDispatcher)
	require.ErrorIs(t, h.remove(unknown), messaging.ErrUnknownDispatcher)
	require.ErrorIs(t, h.svc.Reset(ctx, messaging.ResetRequest{Dispatcher: good.Dispatcher, Registration: good.Registration, Epoch: 1}), messaging.ErrInvalidRequest)
	require.NoError(t, h.reset(good.Dispatcher, 2, 1))
	require.ErrorIs(t, h.reset(good.Dispatcher, 2, 1), messaging.ErrStaleEpoch)
	stale := messaging.ResetRequest{Dispatcher: good.Dispatcher, Registration: 8, Epoch: 9}
	require.ErrorIs(t, h.svc.Reset(ctx, stale), messaging.ErrStaleRegistration, "another registration's reset changes nothing")
	require.ErrorIs(t, h.svc.Remove(ctx, messaging.RemoveRequest{Dispatcher: good.Dispatcher, Registration: 8}), messaging.ErrStaleRegistration)
	reply, err := h.svc.Heartbeat(ctx, messaging.HeartbeatRequest{Checkpoints: []messaging.DispatcherCheckpoint{
		{Dispatcher: good.Dispatcher, Registration: good.Registration, Epoch: 2, Ts: 1},
		{Dispatcher: good.Dispatcher, Registration: 8, Epoch: 2, Ts: 1},
		{Dispatcher: good.Dispatcher, Registration: good.Registration, Epoch: 1, Ts: 1},
		{Dispatcher: unknown, Registration: 1, Epoch: 1, Ts: 1},
		{Registration: 1, Epoch: 1, Ts: 1},
	}})
	require.NoError(t, err)
	require.Equal(t, []messaging.Code{messaging.CodeOK, messaging.CodeStaleRegistration, messaging.CodeStaleEpoch,
		messaging.CodeUnknownDispatcher, messaging.CodeInvalidRequest}, reply.Codes, "each entry judged on its own")
	_, err = h.svc.Heartbeat(ctx, messaging.HeartbeatRequest{Checkpoints: make([]messaging.DispatcherCheckpoint, messaging.MaxHeartbeatCheckpoints+1)})
	require.ErrorIs(t, err, messaging.ErrInvalidRequest)
	_, err = New(Options{PrepareWorkers: -1, ScanLimitBytes: 10, LargeTxnSplitBytes: 5, MaxMessagesPerTask: 2, BackoffBase: -1,
		MaxDispatchers: 10, ExpectedDispatchers: 11}) // a hint above the limit
	require.ErrorIs(t, err, ErrInvalidOptions)
	for _, f := range []string{"Store", "Schema", "Transport", "PrepareWorkers", "LargeTxnSplitBytes", "MaxMessagesPerTask", "BackoffBase",
		"ExpectedDispatchers"} {
		require.Contains(t, err.Error(), f)
	}
	// A typed nil passes a plain != nil check and used to panic in Register
	// while it held the dispatcher's lock (and Close then hung).
	_, err = New(Options{Store: (*eventstore.Store)(nil), Schema: h.schema, Transport: (*messaging.InProcess)(nil),
		Clock: (*clock.Fake)(nil), Registerer: (*prometheus.Registry)(nil)})
	require.ErrorIs(t, err, ErrInvalidOptions)
	for _, f := range []string{"Store is a nil *eventstore.Store", "Transport is a nil *messaging.InProcess", "Clock is a nil", "Registerer is a nil"} {
		require.Contains(t, err.Error(), f)
	}
	_, err = New(Options{Store: h.store, Schema: h.schema, Transport: h.tr, LargeTxnSplitBytes: 2 << 30})
	require.ErrorIs(t, err, ErrInvalidOptions)
	require.Contains(t, err.Error(), "LargeTxnSplitBytes")

	h.close()
	err = h.svc.Register(ctx, messaging.RegisterRequest{Dispatcher: common.DispatcherIDFromUint64(2), Registration: 1, Span: common.TableSpan(2), Target: testTarget})
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, err, messaging.ErrClosed, "a control-plane error a network can carry")
	require.Equal(t, messaging.CodeClosed, messaging.CodeOf(err))
	require.ErrorIs(t, h.reset(good.Dispatcher, 3, 1), ErrClosed)
	require.ErrorIs(t, h.remove(good.Dispatcher), ErrClosed)
	require.ErrorIs(t, h.heartbeat(good.Dispatcher, 1, 1), ErrClosed)
	require.ErrorIs(t, h.svc.Start(), ErrClosed)
	require.NoError(t, h.svc.Close(), "Close is idempotent")
	require.False(t, h.svc.prepQueues[0].push(newSession(h.dispatcherOrNew(good.Dispatcher), 9, 1)), "nothing is enqueued after Close")
}

// TestCloseUnderLoadWithCongestedTransport: thousands of dispatchers, the
// transport refusing everything, writes in flight: Close returns and
// leaves no goroutine (goleak in TestMain).
func TestCloseUnderLoadWithCongestedTransport(t *testing.T) {
	h := newHarness(t, nil, hooks{})
	h.advanceSchema(1 << 40)
	h.tr.refuse.Store(true)
	const n = 2000
	for i := uint64(1); i <= n; i++ {
		h.register(i, 10)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for ts := common.Ts(20); ctx.Err() == nil; ts += 10 {
				for i := uint64(w + 1); i <= n; i += 4 {
					err := h.up.Push(ctx, common.TableSpan(int64(i)), eventstore.Batch{Rows: []common.Row{row("k", ts-2, ts-1)}, ResolvedTs: ts})
					if err != nil {
						return
					}
				}
			}
		})
	}
	<-h.tr.refused
	require.NoError(t, h.svc.Close())
	cancel()
	wg.Wait()
}

// TestStressNotifyRacesPreparation: many goroutines push, notify directly
// and reset at random while the workers run; afterwards every dispatcher's
// current epoch reaches the final resolved-ts with exactly the rows above
// its start-ts. Run under -race.
func TestStressNotifyRacesPreparation(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.ScanLimitRows = 3; o.ScanQueueSize = 2 }, hooks{})
	h.advanceSchema(1 << 40)
	const n, steps = 16, 60
	ids := make([]common.DispatcherID, n)
	ds := make([]*dispatcher, n)
	for i := range ids {
		ids[i] = h.register(uint64(i+1), 10)
		ds[i] = h.dispatcher(ids[i])
	}
	rowsOf := func(table int, ts common.Ts) []common.Row {
		return []common.Row{row(fmt.Sprintf("t%d-%d-a", table, ts), ts-3, ts-1), row(fmt.Sprintf("t%d-%d-b", table, ts), ts-2, ts-1)}
	}
	final := common.Ts(10 + 10*steps)
	var wg sync.WaitGroup
	for w := range 4 { // pushers: each table by one goroutine, in order
		wg.Go(func() {
			for i := w; i < n; i += 4 {
				for k := 1; k <= steps; k++ {
					ts := common.Ts(10 + 10*k)
					h.push(uint64(i+1), ts, rowsOf(i+1, ts)...)
				}
			}
		})
	}
	for g := range 4 { // direct notifiers, repeating what the store said
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 7))
			for range 20_000 {
				d := ds[r.IntN(n)]
				d.Notify(common.Ts(d.received.Load()), common.Ts(d.maxCommit.Load()))
			}
		})
	}
	epochs := make([]uint64, n)
	wg.Go(func() { // resetter
		r := rand.New(rand.NewPCG(99, 1))
		for range 40 {
			i := r.IntN(n)
			epochs[i]++
			require.NoError(t, h.reset(ids[i], epochs[i]+1, 10))
		}
	})
	wg.Wait()
	for i, id := range ids {
		es := h.check.waitResolved(id, final)
		require.Equal(t, epochs[i]+1, es.epoch)
		require.Len(t, es.rows, 2*steps, "dispatcher %d: exactly the rows above its start-ts", i)
	}
}

func (h *harness) dispatcherOrNew(id common.DispatcherID) *dispatcher {
	if d := h.dispatcher(id); d != nil {
		return d
	}
	return &dispatcher{id: id, svc: h.svc}
}

var _ = schemastore.DDL{}

// TestTargetWithoutDispatchersIsStopped: a target's pump, pending set and
// metrics live as long as it has dispatchers; its last Remove stops it,
// and a later Register of that target starts a fresh one that delivers.
func TestTargetWithoutDispatchersIsStopped(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	h := newHarness(t, func(o *Options) { o.Registerer = reg }, hooks{})
	h.advanceSchema(1 << 40)
	targets := func() int {
		h.svc.mu.RLock()
		defer h.svc.mu.RUnlock()
		return len(h.svc.mu.targets)
	}
	series := func() int {
		n, err := testutil.GatherAndCount(reg, "cdcflow_eventservice_resolved_set_adds_total")
		require.NoError(t, err)
		return n
	}
	a, b := h.register(1, 10), h.register(2, 10)
	h.check.waitResolved(a, 10)
	h.check.waitResolved(b, 10)
	require.Equal(t, 1, targets())
	require.Equal(t, 1, series())
	require.NoError(t, h.remove(a))
	require.Equal(t, 1, targets(), "the target still has a dispatcher")
	require.NoError(t, h.remove(b))
	require.Zero(t, targets(), "the last Remove stops the target")
	require.Zero(t, series(), "and unregisters its metrics")

	c := h.register(3, 10)
	h.push(3, 30, row("x", 15, 20))
	es := h.check.waitResolved(c, 30)
	require.Equal(t, []string{"x"}, keys(es.rows))
	require.Equal(t, 1, targets())
}

// blockResolvedForTest holds the first Resolved-only send (the target's
// pump delivering) until released, once armed.
type blockResolvedForTest struct {
	inner    messaging.Transport
	armed    atomic.Bool
	blocked  chan struct{}
	release  chan struct{}
	released sync.Once
}

func (b *blockResolvedForTest) Send(to messaging.Target, msgs []messaging.Message) error {
	if _, ok := msgs[0].(*messaging.ResolvedBatch); ok && b.armed.CompareAndSwap(true, false) {
		close(b.blocked)
		<-b.release
	}
	return b.inner.Send(to, msgs)
}

func (b *blockResolvedForTest) unblock() { b.released.Do(func() { close(b.release) }) }

// TestRegisterWhileTheLastRemoveStopsItsTarget: the last Remove of a
// target stops its pump (held here, in the targetStopping hook); a
// Register of the same target meanwhile gets a fresh target (its metrics
// register: the old ones are already gone) and works, and Close waits for
// the old pump.
func TestRegisterWhileTheLastRemoveStopsItsTarget(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	stopping := make(chan messaging.Target, 1)
	proceed := make(chan struct{})
	var proceedOnce sync.Once
	release := func() { proceedOnce.Do(func() { close(proceed) }) }
	h := newHarness(t, func(o *Options) { o.Registerer = reg }, hooks{targetStopping: func(name messaging.Target) {
		stopping <- name
		<-proceed
	}})
	defer release() // a failed run must not leave Remove held
	h.advanceSchema(1 << 40)
	a := h.register(1, 10)
	h.check.waitResolved(a, 10)
	h.push(1, 30) // resolved-only: the pump delivers it
	h.check.waitResolved(a, 30)

	removed := make(chan error, 1)
	go func() { removed <- h.remove(a) }()
	require.Equal(t, testTarget, <-stopping) // the old pump is being stopped
	b := h.register(2, 10)                   // same target, meanwhile
	release()
	require.NoError(t, <-removed)
	h.check.waitResolved(b, 10)
	h.push(2, 40, row("y", 15, 20))
	es := h.check.waitResolved(b, 40)
	require.Equal(t, []string{"y"}, keys(es.rows))
}

// deliveredAndCheckpointed registers dispatcher 1 from 10, delivers one row
// and resolved-ts 40 to it, and acknowledges 40 by heartbeat: a reset to a
// start-ts below 40 then has to re-register it in the store.
func (h *harness) deliveredAndCheckpointed() common.DispatcherID {
	h.t.Helper()
	id := h.register(1, 10)
	h.push(1, 40, row("a", 15, 20))
	h.check.waitResolved(id, 40)
	require.NoError(h.t, h.heartbeat(id, 1, 40))
	return id
}

// TestHeartbeatFindsTheDispatcherBySlotOrByID: a heartbeat entry's slot
// (the one the dispatcher's handshake carried) is a hint: an entry whose
// slot names another dispatcher, or lies out of range, still reaches the
// dispatcher it names, and never another; a removed dispatcher's slot goes
// to the next one registered.
func TestHeartbeatFindsTheDispatcherBySlotOrByID(t *testing.T) {
	h := newHarness(t, nil, hooks{})
	h.advanceSchema(1 << 40)
	d1, d2 := h.register(1, 10), h.register(2, 10)
	h.push(1, 40, row("a", 15, 20))
	h.push(2, 40, row("b", 15, 20))
	h.check.waitResolved(d1, 40)
	h.check.waitResolved(d2, 40)
	slotOf := func(id common.DispatcherID) uint32 {
		h.svc.mu.RLock()
		defer h.svc.mu.RUnlock()
		return dispatcherForTest(h.svc, id).slot
	}
	s1, s2 := slotOf(d1), slotOf(d2)
	require.NotEqual(t, s1, s2)
	cp := func(id common.DispatcherID, ts common.Ts, slot uint32) messaging.DispatcherCheckpoint {
		return messaging.DispatcherCheckpoint{Dispatcher: id, Registration: h.regOf(id), Epoch: 1, Ts: ts, Slot: slot}
	}
	reply, err := h.svc.Heartbeat(context.Background(), messaging.HeartbeatRequest{Checkpoints: []messaging.DispatcherCheckpoint{
		cp(d1, 30, s1), cp(d2, 25, s1), cp(common.DispatcherIDFromUint64(9), 35, s2), cp(d1, 35, 1<<31),
	}})
	require.NoError(t, err)
	require.Equal(t, []messaging.Code{messaging.CodeOK, messaging.CodeOK, messaging.CodeUnknownDispatcher, messaging.CodeOK}, reply.Codes)
	// The service's record, not the store's: the store is told only of
	// a checkpoint with rows below it (storeNeedsCheckpoint), and d1's
	// 35 has none above its 30.
	st1, err := h.svc.Inspect(d1)
	require.NoError(t, err)
	st2, err := h.svc.Inspect(d2)
	require.NoError(t, err)
	require.Equal(t, common.Ts(35), st1.Checkpoint)
	require.Equal(t, common.Ts(25), st2.Checkpoint, "d2's entry, in d1's slot, reached d2")

	require.NoError(t, h.svc.Remove(context.Background(), messaging.RemoveRequest{Dispatcher: d1, Registration: h.regOf(d1)}))
	d3 := h.register(3, 10)
	require.Equal(t, s1, slotOf(d3), "the slot was reused")
	reply, err = h.svc.Heartbeat(context.Background(), messaging.HeartbeatRequest{Checkpoints: []messaging.DispatcherCheckpoint{cp(d1, 40, s1)}})
	require.NoError(t, err)
	require.Equal(t, []messaging.Code{messaging.CodeUnknownDispatcher}, reply.Codes, "the removed dispatcher's entry in its old slot reaches nobody")
	st3, err := h.svc.Inspect(d3)
	require.NoError(t, err)
	require.Equal(t, common.Ts(10), st3.Checkpoint)
}

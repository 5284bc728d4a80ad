package eventservice

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
)

// unregisterHookStoreForTest is the real store with a hook run inside
// UnregisterDispatcher, before the store's own (where a store callback in
// flight would still reach the dispatchers).
type unregisterHookStoreForTest struct {
	*eventstore.Store
	onUnregister atomic.Pointer[func(common.DispatcherID)]
}

func (s *unregisterHookStoreForTest) UnregisterDispatcher(id common.DispatcherID) error {
	if f := s.onUnregister.Load(); f != nil {
		(*f)(id)
	}
	return s.Store.UnregisterDispatcher(id)
}

// TestAStoreNotificationOnceCloseBeganChangesNothing: Close refuses
// notifications from its first step, before it unregisters anything, so
// a store callback that comes in while Close unregisters the dispatchers
// (here: every dispatcher is notified from inside the first store
// unregistration, when the others are still registered, idle, and the
// workers still run) or after it unregistered them all
// (pointCloseUnregistered) neither moves a dispatcher's frontier nor
// counts a notification nor queues a preparation: no work starts on a
// service that is stopping.
func TestAStoreNotificationOnceCloseBeganChangesNothing(t *testing.T) {
	const n = 3
	var store *unregisterHookStoreForTest
	var ds []*dispatcher
	type seen struct {
		received, notifications uint64
		state                   scanState
		queued                  int
	}
	look := func(d *dispatcher) seen {
		st, _ := d.session.Load().sched.load()
		return seen{received: d.received.Load(), notifications: d.svc.counters[d.worker].notifications.Load(),
			state: st, queued: d.svc.prepQueues[d.worker].len()}
	}
	// notifyAll notifies every dispatcher and returns what each looked
	// like before and after its notification.
	notifyAll := func() (before, after []seen) {
		for _, d := range ds {
			b := look(d)
			d.Notify(common.Ts(b.received)+100, common.Ts(b.received)+100)
			before, after = append(before, b), append(after, look(d))
		}
		return before, after
	}
	var duringBefore, duringAfter, lateBefore, lateAfter []seen
	// ended rings after an owner ended its preparation or scan (the
	// session's state already moved): a doorbell of one, so a wait for
	// idle misses no end.
	ended := make(chan struct{}, 1)
	ring := func() {
		select {
		case ended <- struct{}{}:
		default:
		}
	}
	h := newHarness(t, func(o *Options) {
		store = &unregisterHookStoreForTest{Store: o.Store.(*eventstore.Store)}
		o.Store = store
	}, hooks{closeUnregistered: func() { lateBefore, lateAfter = notifyAll() },
		prepared: func(*session, prepareOutcome) { ring() }, scanned: func(*session, scanOutcome) { ring() }})
	h.advanceSchema(1 << 40)
	for i := uint64(1); i <= n; i++ {
		id := h.register(i, 10)
		h.push(i, 20)
		h.check.waitResolved(id, 20)
		ds = append(ds, h.dispatcher(id))
	}
	// Published 20 is not yet idle: the owner ends its preparation after
	// the publish.
	for _, d := range ds {
		for {
			if st, _ := d.session.Load().sched.load(); st == stateIdle {
				break
			}
			select {
			case <-ended:
			case <-time.After(30 * time.Second):
				t.Fatalf("d %v never idle", d.id)
			}
		}
	}
	first := func(common.DispatcherID) {
		store.onUnregister.Store(nil)
		duringBefore, duringAfter = notifyAll()
	}
	store.onUnregister.Store(&first)

	h.close()
	require.NotNil(t, duringBefore, "Close unregistered a dispatcher from the store")
	require.NotNil(t, lateBefore, "Close reached pointCloseUnregistered")
	live := 0
	for i := range ds {
		for _, c := range []struct {
			when          string
			before, after seen
		}{{"while Close unregisters", duringBefore[i], duringAfter[i]}, {"after Close unregistered all", lateBefore[i], lateAfter[i]}} {
			require.Equal(t, uint64(20), c.before.received)
			require.Equal(t, c.before.received, c.after.received, "%s: d%d's frontier moved", c.when, i+1)
			require.Equal(t, c.before.notifications, c.after.notifications, "%s: d%d's notification was counted", c.when, i+1)
			require.Equal(t, c.before.state.String(), c.after.state.String(), "%s: d%d's session changed state", c.when, i+1)
			require.Equal(t, c.before.queued, c.after.queued, "%s: d%d's notification queued work", c.when, i+1)
		}
		if duringBefore[i].state == stateIdle {
			live++
		}
	}
	require.Equal(t, n-1, live, "while Close unregistered the first, the others were still idle and registered")
}

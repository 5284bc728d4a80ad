package eventstore

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
)

// TestADispatcherUnregisteredWhileAnotherIsNotifiedIsNotNotifiedAfter: no
// notification after UnregisterDispatcher returned, even from a write
// batch already notifying the span. Two dispatchers share a subscription;
// the write worker is inside the first one's callback for resolved-ts 10,
// holding the list of subscribers it took at the commit, the second one
// still ahead in it. The second one is unregistered then: it has no
// callback in flight, so UnregisterDispatcher returns at once, without
// waiting. The first callback is then released; the worker goes on down
// its list and must skip the second dispatcher. Once the first dispatcher
// saw the next advance (20), the batch of 10 is done, and the second
// dispatcher must have had no call after its unregistration returned.
func TestADispatcherUnregisteredWhileAnotherIsNotifiedIsNotNotifiedAfter(t *testing.T) {
	stopWaited := make(chan struct{}, 1)
	env := newTestEnv(t, nil, func(s *Store) {
		s.knobs.stopWaits = func() {
			select {
			case stopWaited <- struct{}{}:
			default:
			}
		}
	})
	span := common.TableSpan(1)

	// The first dispatcher's first callback blocks the write worker until
	// release; the cleanup releases it before the store's Close (which
	// would wait for it) even after a failure.
	first := newRecorder()
	entered, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	releaseFirst := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(releaseFirst)
	held := false // only the write worker calls it, one call at a time
	require.NoError(t, env.store.RegisterDispatcher(did(1), span, 0, NotifierFunc(func(resolved, maxCommit common.Ts) {
		if !held {
			held = true
			close(entered)
			<-release
		}
		first.Notify(resolved, maxCommit)
	})))

	// The second dispatcher records every call and whether it came after
	// its unregistration returned.
	var mu sync.Mutex
	var unregistered bool
	var callsAfter []common.Ts
	require.NoError(t, env.store.RegisterDispatcher(did(2), span, 0, NotifierFunc(func(resolved, _ common.Ts) {
		mu.Lock()
		defer mu.Unlock()
		if unregistered {
			callsAfter = append(callsAfter, resolved)
		}
	})))
	require.Len(t, env.up.subs(), 1, "one subscription, shared")
	sub := env.up.last(t, span)

	push(t, sub, 10)
	<-entered // the worker notifies 10: the first dispatcher's callback is in flight

	done := make(chan error, 1)
	go func() {
		err := env.store.UnregisterDispatcher(did(2))
		mu.Lock()
		unregistered = true
		mu.Unlock()
		done <- err
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-stopWaited:
		t.Fatal("UnregisterDispatcher waited for a callback: the second dispatcher had none in flight")
	case <-time.After(10 * time.Second):
		t.Fatal("UnregisterDispatcher did not return while another dispatcher's callback was in flight")
	}

	releaseFirst()
	require.Equal(t, common.Ts(10), first.next(t).resolved)
	push(t, sub, 20)
	require.Equal(t, common.Ts(20), first.next(t).resolved, "the batch of 10 is done")
	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, callsAfter, "calls of the second dispatcher after UnregisterDispatcher returned")
}

// TestADispatcherRegisteredWhileANotificationIsHeldIsNotToldItTwice:
// notifications of one dispatcher strictly increase. With a NotifyInterval
// the advance to 20 is committed and held back; a second dispatcher joins
// the subscription meanwhile and is told 20 at its registration (the
// committed resolved-ts). When the interval is up the throttle notifies
// the held 20 to every dispatcher of the subscription: the first one hears
// it, the second one, told already, must not hear it again. A second held
// advance (30), flushed by the same goroutine after it, shows that the
// flush of 20 is over.
func TestADispatcherRegisteredWhileANotificationIsHeldIsNotToldItTwice(t *testing.T) {
	env, armed, published := newThrottledEnv(t)
	// flush waits for the flusher to arm its timer for a held advance and
	// then lets the interval pass.
	flush := func() {
		t.Helper()
		for d := range armed {
			if d <= 100*time.Millisecond {
				break
			}
		}
		env.clk.Advance(100 * time.Millisecond)
	}
	span := common.TableSpan(1)
	r1, r2 := newRecorder(), newRecorder()
	require.NoError(t, env.store.RegisterDispatcher(did(1), span, 0, r1))
	sub := env.up.last(t, span)
	push(t, sub, 10)
	require.Equal(t, common.Ts(10), r1.next(t).resolved, "the first advance is notified at once")
	require.Equal(t, common.Ts(10), <-published)
	push(t, sub, 20)
	require.Equal(t, common.Ts(20), <-published) // committed and held back
	r1.none(t)

	require.NoError(t, env.store.RegisterDispatcher(did(2), span, 0, r2))
	require.Len(t, env.up.subs(), 1, "the second dispatcher shares the subscription")
	require.Equal(t, common.Ts(20), r2.next(t).resolved, "told the committed resolved-ts at registration")

	flush()
	require.Equal(t, common.Ts(20), r1.next(t).resolved, "the held advance, once the interval is up")
	push(t, sub, 30)
	require.Equal(t, common.Ts(30), <-published) // held back again
	flush()
	require.Equal(t, common.Ts(30), r1.next(t).resolved)
	require.Equal(t, common.Ts(30), r2.next(t).resolved, "the second dispatcher's next notification is 30, not 20 again")
	r1.none(t)
	r2.none(t)
}

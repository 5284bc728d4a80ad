package eventservice

import (
	"sync"

	"github.com/cdcflow/eventservice/pkg/messaging"
)

// roomWatch wakes a target's refused senders when the target has room
// again, for transports that can say so (messaging.RoomNotifier): a session
// whose send was refused as busy parks here (in backing_off, so requests
// are absorbed) instead of on a back-off timer, and the resolved-ts pump's
// back-off is cut short. A busy collector then costs a wakeup when it has
// drained, not up to BackoffMax of idling after it did. Other failures
// (and transports without the signal) keep the timed back-off.
//
// One goroutine per target (started with the target, stopped with it)
// waits for the bell, then for room, then re-queues every waiter. A waiter
// rings the bell after it is listed, so none is missed; a stale waiter
// (retired meanwhile) is dropped by its transition.
type roomWatch struct {
	rn   messaging.RoomNotifier
	bell chan struct{} // capacity one: someone waits for room
	stop chan struct{}
	wg   sync.WaitGroup // the watcher goroutine
	mu   struct {
		sync.Mutex
		waiting []*session
	}
}

func newRoomWatch(rn messaging.RoomNotifier) *roomWatch {
	return &roomWatch{rn: rn, bell: make(chan struct{}, 1), stop: make(chan struct{})}
}

// wait parks s, which just moved to backing_off after a busy refusal,
// until the target has room.
func (w *roomWatch) wait(s *session) {
	w.mu.Lock()
	w.mu.waiting = append(w.mu.waiting, s)
	w.mu.Unlock()
	w.ring()
}

// hasRoom reports whether target name has room now (RoomNotifier.HasRoom):
// a scan that finds none waits for it before reading.
func (w *roomWatch) hasRoom(name messaging.Target) bool { return w.rn.HasRoom(name) }

// ring asks the watcher to wait for room (the pump does, with no waiter).
func (w *roomWatch) ring() {
	select {
	case w.bell <- struct{}{}:
	default:
	}
}

// start runs the watcher goroutine of target t until close.
func (w *roomWatch) start(t *target) { w.wg.Go(func() { w.run(t) }) }

func (w *roomWatch) run(t *target) {
	for {
		select {
		case <-w.bell:
		case <-w.stop:
			return
		}
		select {
		case <-w.rn.Room(t.name):
		case <-w.stop:
			return
		}
		w.wake(t)
	}
}

// wake re-queues every waiter of target t, which has room again, and wakes
// its resolved-ts pump.
func (w *roomWatch) wake(t *target) {
	w.mu.Lock()
	waiting := w.mu.waiting
	w.mu.waiting = nil
	w.mu.Unlock()
	for _, s := range waiting {
		t.svc.backoffExpired(s)
	}
	t.pump.Wake()
}

// close stops the watcher and waits for it.
func (w *roomWatch) close() {
	close(w.stop)
	w.wg.Wait()
}

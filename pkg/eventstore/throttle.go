package eventstore

import (
	"sync"
	"time"

	"github.com/cdcflow/eventservice/internal/dueheap"
)

// notifyThrottle holds back the resolved-ts notifications of a subscription
// that was notified less than NotifyInterval ago, and notifies its latest
// resolved-ts once the interval is up: a real upstream's cadence
// (TiCDC's event store subscribes with AdvanceIntervalInMs) without ever
// losing the last advance. A held subscription is scheduled once, on a
// heap served by one goroutine and one timer, so the cost follows the
// advances, not the number of subscriptions.
//
// Lock order: subscription.mu, then notifyThrottle.mu (publish schedules
// under the subscription's lock); the flusher takes notifyThrottle.mu
// alone and releases it before taking a subscription's.
type notifyThrottle struct {
	doorbell chan struct{} // the earliest due time may have changed
	mu       struct {
		sync.Mutex
		due dueheap.Heap[*subscription]
	}
}

// schedule has sub notified at due. REQUIRES: sub.mu held and
// sub.mu.notifyHeld newly set.
func (t *notifyThrottle) schedule(sub *subscription, due time.Time) {
	t.mu.Lock()
	t.mu.due.Push(due, sub)
	first, _ := t.mu.due.Peek()
	t.mu.Unlock()
	if first.Item == sub {
		select {
		case t.doorbell <- struct{}{}:
		default:
		}
	}
}

// throttledLocked reports whether sub, whose resolved-ts just advanced at
// now, must wait for its interval; if so it is scheduled (once) and the
// caller notifies nobody. Otherwise the caller notifies now, and this
// records when. REQUIRES: sub.mu held.
func (s *Store) throttledLocked(sub *subscription, now time.Time) bool {
	iv := s.opts.NotifyInterval
	if iv <= 0 {
		return false
	}
	if sub.mu.notifyHeld {
		return true // already scheduled: the flush notifies the latest
	}
	if next := sub.mu.notifiedAt.time().Add(iv); sub.mu.notifiedAt != 0 && now.Before(next) {
		sub.mu.notifyHeld = true
		s.throttle.schedule(sub, next)
		return true
	}
	sub.mu.notifiedAt = stampOf(now)
	return false
}

// runThrottle is the flusher: it notifies held subscriptions when due.
func (s *Store) runThrottle() {
	t := &s.throttle
	timer := s.opts.Clock.NewTimer(time.Hour)
	defer timer.Stop()
	var due []dueheap.Entry[*subscription]
	for {
		now := s.opts.Clock.Now()
		t.mu.Lock()
		due = t.mu.due.PopDue(now, due[:0])
		next, ok := t.mu.due.Peek()
		wait := next.Due.Sub(now)
		t.mu.Unlock()
		for _, e := range due {
			s.flushNotify(e.Item, now)
		}
		clear(due)
		if !ok {
			wait = time.Hour
		}
		timer.Stop()
		timer.Reset(wait)
		if h := s.knobs.throttleArmed; h != nil {
			h(wait)
		}
		select {
		case <-timer.C():
		case <-t.doorbell:
		case <-s.closing:
			return
		}
	}
}

// flushNotify notifies sub's subscribers of its latest resolved-ts, which
// the throttle held back.
func (s *Store) flushNotify(sub *subscription, now time.Time) {
	sub.mu.Lock()
	sub.mu.notifyHeld = false
	sub.mu.notifiedAt = stampOf(now)
	resolved, mc, subscribers := sub.mu.resolved, sub.mu.maxCommit, sub.mu.subscribers
	sub.mu.Unlock()
	n := 0
	for _, sb := range subscribers {
		if sb.notify(s, resolved, mc) {
			n++
		}
	}
	s.metrics.notifications.Add(float64(n))
}

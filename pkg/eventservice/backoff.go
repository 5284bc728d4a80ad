package eventservice

import (
	"math"
	"sync"
	"time"

	"github.com/cdcflow/eventservice/internal/backoff"
	"github.com/cdcflow/eventservice/internal/dueheap"
	"github.com/cdcflow/eventservice/pkg/clock"
)

// dueTimers is a min-heap of items waiting out a back-off, served by one
// goroutine and one timer, so a million backed-off dispatchers cost a
// million heap entries, not a million timers. The service has two: backed
// off sessions (the data plane) and dispatchers whose store re-registration
// failed (the control plane's registrar).
type dueTimers[T comparable] struct {
	clk clock.Clock
	mu  struct {
		sync.Mutex
		h dueheap.Heap[T]
	}
	doorbell chan struct{} // the earliest deadline changed
	scratch  []dueheap.Entry[T]
	ready    []T
}

func newDueTimers[T comparable](clk clock.Clock) *dueTimers[T] {
	return &dueTimers[T]{clk: clk, doorbell: make(chan struct{}, 1)}
}

// arm schedules item after d. An entry whose item no longer waits (a
// removed session) stays until it fires and is then dropped as stale by
// its handler; the heap is bounded by live items plus those removed within
// the last BackoffMax.
func (b *dueTimers[T]) arm(item T, d time.Duration) {
	b.mu.Lock()
	b.mu.h.Push(b.clk.Now().Add(d), item)
	first, _ := b.mu.h.Peek()
	b.mu.Unlock()
	if first.Item == item {
		select {
		case b.doorbell <- struct{}{}:
		default:
		}
	}
}

func (b *dueTimers[T]) len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.mu.h.Len()
}

// fireDue pops the entries due at now, hands each to fire (outside the
// lock) and returns the delay to the next one. Only the timer goroutine
// calls it (it owns scratch and ready).
func (b *dueTimers[T]) fireDue(now time.Time, fire func(T)) (time.Duration, bool) {
	b.mu.Lock()
	b.scratch = b.mu.h.PopDue(now, b.scratch[:0])
	for _, e := range b.scratch {
		b.ready = append(b.ready, e.Item)
	}
	clear(b.scratch)
	next, ok := b.mu.h.Peek()
	b.mu.Unlock()
	for _, item := range b.ready {
		fire(item)
	}
	clear(b.ready)
	b.ready = b.ready[:0]
	if !ok {
		return 0, false
	}
	return next.Due.Sub(now), true
}

// run fires b's entries as they fall due, until closing is closed.
func (b *dueTimers[T]) run(closing <-chan struct{}, fire func(T)) {
	timer := b.clk.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		wait, ok := b.fireDue(b.clk.Now(), fire)
		if !ok {
			wait = time.Hour
		}
		timer.Stop()
		timer.Reset(wait)
		select {
		case <-timer.C():
		case <-b.doorbell:
		case <-closing:
			return
		}
	}
}

// backoffJitter is the fraction by which Options.Rand shortens a back-off
// delay at most.
const backoffJitter = 0.2

// backoffDelay is the delay of back-off attempt n (counted from 0 since the
// last success): BackoffBase doubled per attempt, capped at BackoffMax,
// shortened by up to backoffJitter (20%) at random (Options.Rand) so
// dispatchers refused together do not retry together. It is the service's
// one back-off, for sends and for store re-registrations alike, and the
// module's (internal/backoff.Delay, whose failures count from 1).
func (svc *Service) backoffDelay(n int) time.Duration {
	return backoff.Delay(min(n, math.MaxInt-1)+1, svc.opts.BackoffBase, svc.opts.BackoffMax, backoffJitter, svc.opts.Rand())
}

// backoffExpired re-queues a session whose back-off expired (a stale entry
// of a retired session is dropped by its transition).
func (svc *Service) backoffExpired(s *session) {
	if act, _ := s.sched.fire(evBackoffExpired); act == actEnqueuePrepare {
		svc.enqueue(s)
	}
}

package eventservice

import (
	"math/rand/v2"
	"sync"
	"time"

	"github.com/cdcflow/eventservice/internal/dueheap"
	"github.com/cdcflow/eventservice/pkg/clock"
)

// backoffTimers is a min-heap of sessions waiting out a back-off, served by
// one goroutine and one timer, so a million backed-off dispatchers cost a
// million heap entries, not a million timers.
type backoffTimers struct {
	clk clock.Clock
	mu  struct {
		sync.Mutex
		h dueheap.Heap[*session]
	}
	doorbell chan struct{} // the earliest deadline changed
	scratch  []dueheap.Entry[*session]
}

func newBackoffTimers(clk clock.Clock) *backoffTimers {
	return &backoffTimers{clk: clk, doorbell: make(chan struct{}, 1)}
}

// arm schedules s's evBackoffExpired after d. A removed session's entry
// stays until it fires and is then dropped as stale; the heap is bounded by
// live sessions plus those removed within the last BackoffMax.
func (b *backoffTimers) arm(s *session, d time.Duration) {
	b.mu.Lock()
	b.mu.h.Push(b.clk.Now().Add(d), s)
	first, _ := b.mu.h.Peek()
	b.mu.Unlock()
	if first.Item == s {
		select {
		case b.doorbell <- struct{}{}:
		default:
		}
	}
}

func (b *backoffTimers) len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.mu.h.Len()
}

// due pops the entries due at now and returns the delay to the next one.
// Only the timer goroutine calls it (it owns scratch).
func (b *backoffTimers) due(now time.Time, dst []*session) ([]*session, time.Duration, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.scratch = b.mu.h.PopDue(now, b.scratch[:0])
	for _, e := range b.scratch {
		dst = append(dst, e.Item)
	}
	clear(b.scratch)
	next, ok := b.mu.h.Peek()
	if !ok {
		return dst, 0, false
	}
	return dst, next.Due.Sub(now), true
}

// backoffDelay is the owner's next back-off delay: BackoffBase doubled per
// consecutive refusal, capped at BackoffMax, shortened by up to 20% of
// jitter so dispatchers refused together do not retry together.
func (svc *Service) backoffDelay(s *session) time.Duration {
	d := svc.opts.BackoffBase << min(s.backoffN, 30)
	if d <= 0 || d > svc.opts.BackoffMax {
		d = svc.opts.BackoffMax
	}
	s.backoffN++
	return d - time.Duration(rand.Float64()*0.2*float64(d))
}

// runBackoffTimers re-queues sessions whose back-off expired.
func (svc *Service) runBackoffTimers() {
	b := svc.backoff
	timer := b.clk.NewTimer(time.Hour)
	defer timer.Stop()
	var ready []*session
	for {
		var wait time.Duration
		var ok bool
		ready, wait, ok = b.due(b.clk.Now(), ready[:0])
		for _, s := range ready {
			if act, _ := s.sched.fire(evBackoffExpired); act == actEnqueuePrepare {
				svc.enqueue(s)
			}
		}
		clear(ready)
		if !ok {
			wait = time.Hour
		}
		timer.Stop()
		timer.Reset(wait)
		select {
		case <-timer.C():
		case <-b.doorbell:
		case <-svc.closing:
			return
		}
	}
}

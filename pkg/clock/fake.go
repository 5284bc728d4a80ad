package clock

import (
	"context"
	"sync"
	"time"
)

// Fake is a manually advanced Clock for tests. Time moves only in Advance
// and Set. Like Go's timers, the fake's are monotonic: they measure the
// time Advance moved, so Set, which changes only the wall reading (a clock
// jump, forward or back), fires nothing and delays nothing. The timers and
// tickers that became due fire in Advance, earliest first, by a
// non-blocking send on their one-slot channel. WaitWaiters lets
// a test wait, without sleeping or polling, until the code under test has
// armed a timer, and then advance.
//
// INVARIANT: mu.waiters holds exactly the armed timers and running tickers.
// Lock order: Fake.mu is a leaf; callers may hold their own locks while
// calling any method (pendingset.Set reads Now under its lock).
type Fake struct {
	mu struct {
		sync.Mutex
		now time.Time
		// mono is the monotonic time: how far Advance moved the clock.
		// Deadlines are on it.
		mono    time.Duration
		waiters []*fakeWaiter
		// changed is closed and replaced whenever waiters change.
		changed chan struct{}
	}
}

var _ Clock = (*Fake)(nil)

type fakeWaiter struct {
	f      *Fake
	c      chan time.Time
	period time.Duration // zero for a timer
	next   time.Duration // the monotonic deadline
}

// NewFake returns a fake clock reading now until advanced.
func NewFake(now time.Time) *Fake {
	f := &Fake{}
	f.mu.now = now
	f.mu.changed = make(chan struct{})
	return f
}

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mu.now
}

// Advance moves the clock forward by d and fires what became due, each at
// its deadline (a ticker that missed several ticks gets one).
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	target := f.mu.mono + max(d, 0)
	changed := false
	for {
		var due *fakeWaiter
		for _, w := range f.mu.waiters {
			if w.next <= target && (due == nil || w.next < due.next) {
				due = w
			}
		}
		if due == nil {
			break
		}
		f.mu.now = f.mu.now.Add(due.next - f.mu.mono)
		f.mu.mono = due.next
		select {
		case due.c <- f.mu.now:
		default: // a tick is pending: drop this one
		}
		if due.period > 0 {
			due.next += due.period
		} else {
			f.removeLocked(due)
			changed = true
		}
	}
	f.mu.now = f.mu.now.Add(target - f.mu.mono)
	f.mu.mono = target
	if changed {
		f.changedLocked()
	}
}

// Set makes Now read t from now on: a wall-clock jump, forward or back. It
// fires nothing; armed deadlines stay as far away as they were.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.mu.now = t
}

// Waiters returns how many timers are armed and tickers running.
func (f *Fake) Waiters() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.mu.waiters)
}

// NextDue returns how far the earliest armed timer or ticker is from Now,
// and false if none is armed.
func (f *Fake) NextDue() (time.Duration, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.mu.waiters) == 0 {
		return 0, false
	}
	at := f.mu.waiters[0].next
	for _, w := range f.mu.waiters[1:] {
		at = min(at, w.next)
	}
	return at - f.mu.mono, true
}

// WaitWaiters blocks until at least n timers or tickers are armed, or ctx
// is done.
func (f *Fake) WaitWaiters(ctx context.Context, n int) error {
	for {
		f.mu.Lock()
		if len(f.mu.waiters) >= n {
			f.mu.Unlock()
			return nil
		}
		ch := f.mu.changed
		f.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// NewTimer returns a timer driven by Advance and Set; d <= 0 fires at once.
func (f *Fake) NewTimer(d time.Duration) Timer {
	f.mu.Lock()
	defer f.mu.Unlock()
	w := &fakeWaiter{f: f, c: make(chan time.Time, 1)}
	f.armLocked(w, d)
	return w
}

// NewTicker returns a ticker driven by Advance and Set.
func (f *Fake) NewTicker(d time.Duration) Ticker {
	f.mu.Lock()
	defer f.mu.Unlock()
	w := &fakeWaiter{f: f, c: make(chan time.Time, 1), period: d, next: f.mu.mono + d}
	f.mu.waiters = append(f.mu.waiters, w)
	f.changedLocked()
	return fakeTicker{w}
}

// armLocked (re)arms timer w to fire d from now. REQUIRES: f.mu held and w
// not armed.
func (f *Fake) armLocked(w *fakeWaiter, d time.Duration) {
	w.next = f.mu.mono + d
	if d <= 0 {
		select {
		case w.c <- f.mu.now:
		default:
		}
		return
	}
	f.mu.waiters = append(f.mu.waiters, w)
	f.changedLocked()
}

// removeLocked disarms w and reports whether it was armed.
func (f *Fake) removeLocked(w *fakeWaiter) bool {
	for i, x := range f.mu.waiters {
		if x == w {
			f.mu.waiters = append(f.mu.waiters[:i], f.mu.waiters[i+1:]...)
			return true
		}
	}
	return false
}

func (f *Fake) changedLocked() {
	close(f.mu.changed)
	f.mu.changed = make(chan struct{})
}

// fakeTicker hides the timer methods of a periodic waiter.
type fakeTicker struct{ w *fakeWaiter }

func (t fakeTicker) C() <-chan time.Time { return t.w.c }
func (t fakeTicker) Stop()               { t.w.Stop() }

func (w *fakeWaiter) C() <-chan time.Time { return w.c }

func (w *fakeWaiter) Stop() bool {
	w.f.mu.Lock()
	defer w.f.mu.Unlock()
	if w.f.removeLocked(w) {
		w.f.changedLocked()
		return true
	}
	return false
}

func (w *fakeWaiter) Reset(d time.Duration) {
	w.f.mu.Lock()
	defer w.f.mu.Unlock()
	if w.f.removeLocked(w) && d <= 0 {
		w.f.changedLocked() // disarmed, and not armed again
	}
	w.f.armLocked(w, d)
}

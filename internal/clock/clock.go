// Package clock abstracts time for the project's components so that tests can
// drive timers deterministically.
//
// Invariants: Real is stateless; Fake never fires a ticker or timer except
// from Advance, on the caller's goroutine, and never blocks doing so (ticks
// are delivered on capacity-one channels and dropped when one is already
// pending, like time.Ticker).
package clock

import (
	"sync"
	"time"
)

// Clock is the time source a component uses. The zero value of an options
// field of this type means Real.
type Clock interface {
	Now() time.Time
	// NewTicker returns a ticker firing every d. d must be positive.
	NewTicker(d time.Duration) Ticker
	// NewTimer returns a timer firing once after d.
	NewTimer(d time.Duration) Timer
}

// Ticker is the part of time.Ticker components use.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// Timer is the part of time.Timer components use.
type Timer interface {
	C() <-chan time.Time
	// Reset re-arms the timer to fire after d.
	Reset(d time.Duration)
	// Stop disarms the timer and reports whether it was armed.
	Stop() bool
}

// Real is the wall clock.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// NewTicker wraps time.NewTicker.
func (Real) NewTicker(d time.Duration) Ticker { return realTicker{time.NewTicker(d)} }

// NewTimer wraps time.NewTimer.
func (Real) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTicker struct{ t *time.Ticker }

func (r realTicker) C() <-chan time.Time { return r.t.C }
func (r realTicker) Stop()               { r.t.Stop() }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time   { return r.t.C }
func (r realTimer) Reset(d time.Duration) { r.t.Reset(d) }
func (r realTimer) Stop() bool            { return r.t.Stop() }

// OrReal returns c, or Real when c is nil.
func OrReal(c Clock) Clock {
	if c == nil {
		return Real{}
	}
	return c
}

// Fake is a manually advanced clock for tests.
type Fake struct {
	mu struct {
		sync.Mutex
		now     time.Time
		waiters []*fakeWaiter
	}
}

type fakeWaiter struct {
	f      *Fake
	c      chan time.Time
	period time.Duration // zero for a timer
	next   time.Time
	active bool
}

// NewFake returns a fake clock set to now.
func NewFake(now time.Time) *Fake {
	f := &Fake{}
	f.mu.now = now
	return f
}

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.mu.now
}

// Advance moves the clock forward by d and fires every ticker and timer
// that became due, in order of their due time.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	target := f.mu.now.Add(d)
	for {
		var due *fakeWaiter
		for _, w := range f.mu.waiters {
			if w.active && !w.next.After(target) && (due == nil || w.next.Before(due.next)) {
				due = w
			}
		}
		if due == nil {
			break
		}
		f.mu.now = due.next
		select {
		case due.c <- due.next:
		default:
		}
		if due.period > 0 {
			due.next = due.next.Add(due.period)
		} else {
			due.active = false
		}
	}
	f.mu.now = target
}

// Waiters returns how many tickers and timers are armed; tests use it to
// know a component reached its wait before advancing the clock.
func (f *Fake) Waiters() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, w := range f.mu.waiters {
		if w.active {
			n++
		}
	}
	return n
}

// NewTicker returns a ticker driven by Advance.
func (f *Fake) NewTicker(d time.Duration) Ticker { return fakeTicker{f.add(d, d)} }

// fakeTicker hides the timer methods of a periodic waiter.
type fakeTicker struct{ w *fakeWaiter }

func (t fakeTicker) C() <-chan time.Time { return t.w.c }
func (t fakeTicker) Stop()               { t.w.Stop() }

// NewTimer returns a timer driven by Advance.
func (f *Fake) NewTimer(d time.Duration) Timer { return f.add(d, 0) }

func (f *Fake) add(d, period time.Duration) *fakeWaiter {
	f.mu.Lock()
	defer f.mu.Unlock()
	w := &fakeWaiter{f: f, c: make(chan time.Time, 1), period: period, next: f.mu.now.Add(d), active: true}
	f.mu.waiters = append(f.mu.waiters, w)
	return w
}

func (w *fakeWaiter) C() <-chan time.Time { return w.c }

func (w *fakeWaiter) Stop() bool {
	w.f.mu.Lock()
	defer w.f.mu.Unlock()
	was := w.active
	w.active = false
	for i, x := range w.f.mu.waiters {
		if x == w {
			w.f.mu.waiters = append(w.f.mu.waiters[:i], w.f.mu.waiters[i+1:]...)
			break
		}
	}
	return was
}

func (w *fakeWaiter) Reset(d time.Duration) {
	w.f.mu.Lock()
	defer w.f.mu.Unlock()
	w.next = w.f.mu.now.Add(d)
	if !w.active {
		w.active = true
		found := false
		for _, x := range w.f.mu.waiters {
			found = found || x == w
		}
		if !found {
			w.f.mu.waiters = append(w.f.mu.waiters, w)
		}
	}
}

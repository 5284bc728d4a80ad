// Package pendingsettest provides test helpers for users of pendingset:
// a deterministic FakeClock that satisfies pendingset.Clock. It lives in
// its own package so production binaries do not carry it, and it does not
// import pendingset (Clock's method set uses only standard types), so
// pendingset's own tests can use it too.
package pendingsettest

import (
	"context"
	"slices"
	"sync"
	"time"
)

// FakeClock is a manually advanced clock. Time moves only in Advance;
// timers fire inside Advance, in deadline order, by a non-blocking send
// on their one-slot channel. It starts no goroutine.
//
// INVARIANT: mu.timers holds exactly the armed, unfired, unstopped timers.
// LOCK ORDER: FakeClock.mu is a leaf; callers may hold their own locks
// while calling Now (pendingset.Set does).
type FakeClock struct {
	mu struct {
		sync.Mutex
		now     time.Time
		nextID  uint64
		timers  []*fakeTimer
		changed chan struct{} // closed and replaced whenever timers change
	}
}

type fakeTimer struct {
	id uint64
	at time.Time
	c  chan time.Time
}

// NewFakeClock returns a clock that reads start until advanced.
func NewFakeClock(start time.Time) *FakeClock {
	c := &FakeClock{}
	c.mu.now = start
	c.mu.changed = make(chan struct{})
	return c
}

// Now returns the clock's current time.
func (c *FakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mu.now
}

// NewTimer arms a timer that fires when the clock reaches Now()+d (at once
// if d <= 0). The stop function disarms it and reports whether it was
// still armed, like (*time.Timer).Stop.
func (c *FakeClock) NewTimer(d time.Duration) (<-chan time.Time, func() bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.nextID++
	t := &fakeTimer{id: c.mu.nextID, at: c.mu.now.Add(d), c: make(chan time.Time, 1)}
	if d <= 0 {
		t.c <- c.mu.now
		return t.c, func() bool { return false }
	}
	c.mu.timers = append(c.mu.timers, t)
	c.changedLocked()
	return t.c, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		i := slices.Index(c.mu.timers, t)
		if i < 0 {
			return false
		}
		c.mu.timers = slices.Delete(c.mu.timers, i, i+1)
		c.changedLocked()
		return true
	}
}

// Advance moves the clock forward by d and fires every timer whose deadline
// has been reached, earliest first.
func (c *FakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.mu.now = c.mu.now.Add(d)
	slices.SortStableFunc(c.mu.timers, func(a, b *fakeTimer) int { return a.at.Compare(b.at) })
	fired := 0
	for _, t := range c.mu.timers {
		if t.at.After(c.mu.now) {
			break
		}
		t.c <- c.mu.now // never blocks: one slot, one send per timer
		fired++
	}
	if fired > 0 {
		c.mu.timers = slices.Delete(c.mu.timers, 0, fired)
		c.changedLocked()
	}
}

// Timers returns the number of armed timers.
func (c *FakeClock) Timers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.mu.timers)
}

// NextTimer returns how far the earliest armed timer is from Now, and false
// if none is armed.
func (c *FakeClock) NextTimer() (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.mu.timers) == 0 {
		return 0, false
	}
	at := c.mu.timers[0].at
	for _, t := range c.mu.timers[1:] {
		if t.at.Before(at) {
			at = t.at
		}
	}
	return at.Sub(c.mu.now), true
}

// WaitTimers blocks until at least n timers are armed, or ctx is done. It
// lets a test wait, without sleeping or polling, until the code under test
// has parked on a timer, and then Advance.
func (c *FakeClock) WaitTimers(ctx context.Context, n int) error {
	for {
		c.mu.Lock()
		if len(c.mu.timers) >= n {
			c.mu.Unlock()
			return nil
		}
		ch := c.mu.changed
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (c *FakeClock) changedLocked() {
	close(c.mu.changed)
	c.mu.changed = make(chan struct{})
}

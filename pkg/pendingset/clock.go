package pendingset

import "time"

// Clock is the set's and the pump's source of time. The Set only calls Now;
// the Pump also arms timers to wake for backoff deadlines. Production uses
// the real clock (the default); tests inject a fake such as
// pendingsettest.FakeClock.
//
// NewTimer returns a channel that receives once, at or after d, and a stop
// function with the semantics of (*time.Timer).Stop. The signature uses no
// named types of this package, so a fake clock can satisfy it without
// importing pendingset.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) (c <-chan time.Time, stop func() bool)
}

// realClock is the default Clock: package time.
type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) NewTimer(d time.Duration) (<-chan time.Time, func() bool) {
	t := time.NewTimer(d)
	return t.C, t.Stop
}

package upstream

import "time"

// Clock is the time source of a Generator. Production uses the real clock;
// tests inject a fake one so that the frontier moves only when the test says
// so.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// NewTicker returns a ticker that fires every d. Like time.Ticker it
	// may drop ticks when the receiver is slow: the generator recomputes its
	// frontier from Now on every tick, so a dropped tick loses nothing.
	NewTicker(d time.Duration) Ticker
}

// Ticker is the part of time.Ticker the generator uses.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// realClock is the default Clock.
type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) NewTicker(d time.Duration) Ticker { return realTicker{time.NewTicker(d)} }

type realTicker struct{ t *time.Ticker }

func (r realTicker) C() <-chan time.Time { return r.t.C }
func (r realTicker) Stop()               { r.t.Stop() }

package clock

import "time"

// Clock is the time source a component uses. An options field of this type
// left nil means Real (OrReal).
type Clock interface {
	// Now returns the current time.
	Now() time.Time
	// NewTimer returns a timer that fires once, at or after d. A d <= 0
	// fires at once.
	NewTimer(d time.Duration) Timer
	// NewTicker returns a ticker firing every d; d must be positive. A slow
	// receiver misses ticks rather than queueing them.
	NewTicker(d time.Duration) Ticker
}

// Timer is the part of time.Timer components use.
type Timer interface {
	// C delivers the firing time.
	C() <-chan time.Time
	// Reset re-arms the timer to fire after d.
	Reset(d time.Duration)
	// Stop disarms the timer and reports whether it was armed.
	Stop() bool
}

// Ticker is the part of time.Ticker components use.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// Real is the wall clock.
type Real struct{}

var _ Clock = Real{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// NewTimer wraps time.NewTimer.
func (Real) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

// NewTicker wraps time.NewTicker.
func (Real) NewTicker(d time.Duration) Ticker { return realTicker{time.NewTicker(d)} }

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

package backoff

import (
	"math"
	"math/rand/v2"
	"time"
)

// Delay is the delay before the retry that follows the n-th consecutive
// failure (n is 1-based): min(max, base*2^(n-1)) * (1 - jitter*u), with u
// in [0,1) from the caller's random source. n <= 0 counts as 1. It cannot
// overflow for any n; see the package comment for the edge cases.
func Delay(n int, base, max time.Duration, jitter, u float64) time.Duration {
	if base <= 0 || max <= 0 {
		return 0
	}
	d := min(base, max)
	// d > 0, so each round at least doubles it: at most 63 rounds.
	for k := 1; k < n && d < max; k++ {
		if d > max/2 {
			d = max
			break
		}
		d *= 2
	}
	if !(jitter > 0) { // also NaN
		return d
	}
	jitter = min(jitter, 1)
	if !(u >= 0 && u < 1) { // also NaN
		return d
	}
	// jitter*u < 1, so the cut is below d (and below 2^63): no overflow.
	return d - time.Duration(float64(d)*jitter*u)
}

// Backoff is a retry loop's back-off: it counts consecutive failures and
// returns Delay for each. The zero value has Base and Max 0, so its delays
// are 0; set Base and Max. Not safe for concurrent use.
type Backoff struct {
	// Base is the first delay, Max the cap; Jitter in [0,1] shortens each
	// delay by up to that fraction (0: exact delays).
	Base, Max time.Duration
	Jitter    float64
	// Rand returns a number in [0,1) for the jitter; it is called only when
	// Jitter > 0. Default (nil) math/rand/v2.Float64.
	Rand func() float64

	n int // consecutive failures since the last Reset
}

// Next counts one more failure and returns the delay to wait before the
// next try: Base for the first failure since the last Reset, then doubling
// up to Max.
func (b *Backoff) Next() time.Duration {
	if b.n < math.MaxInt {
		b.n++
	}
	u := 0.0
	if b.Jitter > 0 {
		if b.Rand != nil {
			u = b.Rand()
		} else {
			u = rand.Float64()
		}
	}
	return Delay(b.n, b.Base, b.Max, b.Jitter, u)
}

// Reset forgets the failures: the next Next returns Base (less jitter)
// again. Call it after a success.
func (b *Backoff) Reset() { b.n = 0 }

// Failures is the number of Next calls since the last Reset.
func (b *Backoff) Failures() int { return b.n }

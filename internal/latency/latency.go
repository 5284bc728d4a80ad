package latency

import (
	"math/bits"
	"sync/atomic"
	"time"
)

const (
	subBits    = 3
	subBuckets = 1 << subBits
	groups     = 64 - subBits
	numBuckets = (groups + 1) * subBuckets
)

// Histogram records non-negative durations. The zero value is ready to use.
type Histogram struct {
	counts [numBuckets]atomic.Uint64
	total  atomic.Uint64
	sum    atomic.Uint64
	max    atomic.Uint64
}

func bucketOf(v uint64) int {
	if v < subBuckets {
		return int(v)
	}
	// Position of the highest set bit selects the group, the next subBits
	// bits select the sub-bucket inside it.
	hb := 63 - bits.LeadingZeros64(v)
	shift := hb - subBits
	return (shift+1)*subBuckets + int((v>>shift)&(subBuckets-1))
}

// upperBound returns the largest value that falls in bucket i.
func upperBound(i int) uint64 {
	if i < subBuckets {
		return uint64(i)
	}
	shift := i/subBuckets - 1
	sub := uint64(i % subBuckets)
	lo := (subBuckets + sub) << shift
	return lo + (1 << shift) - 1
}

// Record adds one observation of d (negative durations count as zero).
func (h *Histogram) Record(d time.Duration) { h.RecordValue(max(int64(d), 0)) }

// RecordValue adds one observation of v nanoseconds.
func (h *Histogram) RecordValue(v int64) {
	u := uint64(max(v, 0))
	h.counts[bucketOf(u)].Add(1)
	h.total.Add(1)
	h.sum.Add(u)
	for {
		m := h.max.Load()
		if u <= m || h.max.CompareAndSwap(m, u) {
			return
		}
	}
}

// Count returns the number of observations.
func (h *Histogram) Count() uint64 { return h.total.Load() }

// Max returns the largest observation.
func (h *Histogram) Max() time.Duration { return time.Duration(h.max.Load()) }

// Mean returns the average observation.
func (h *Histogram) Mean() time.Duration {
	n := h.total.Load()
	if n == 0 {
		return 0
	}
	return time.Duration(h.sum.Load() / n)
}

// Quantile returns an upper bound of the q-quantile (0 < q <= 1), capped at
// the exact maximum. It returns 0 when nothing was recorded.
func (h *Histogram) Quantile(q float64) time.Duration {
	n := h.total.Load()
	if n == 0 {
		return 0
	}
	rank := uint64(q*float64(n) + 0.5)
	rank = min(max(rank, 1), n)
	var seen uint64
	for i := range h.counts {
		seen += h.counts[i].Load()
		if seen >= rank {
			return time.Duration(min(upperBound(i), h.max.Load()))
		}
	}
	return h.Max()
}

// Reset clears every observation. It is not atomic with concurrent Records.
func (h *Histogram) Reset() {
	for i := range h.counts {
		h.counts[i].Store(0)
	}
	h.total.Store(0)
	h.sum.Store(0)
	h.max.Store(0)
}

package server

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSamplesFallAtEveryPhaseOfTheCadence: the monitor's waits stay within
// half a period of sampleEvery, and the sample times they make land in
// every millisecond of the generator's 10 ms cadence, so the lag quantiles
// are of the whole cadence and not of one point of it (a fixed 100 ms
// period always read the same point).
func TestSamplesFallAtEveryPhaseOfTheCadence(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 0))
	var phases [10]int
	var at time.Duration
	for range 1000 {
		d := nextSample(rng)
		require.GreaterOrEqual(t, d, sampleEvery/2)
		require.Less(t, d, sampleEvery*3/2)
		at += d
		phases[(at%(10*time.Millisecond))/time.Millisecond]++
	}
	for ms, n := range phases {
		require.Greater(t, n, 50, "phase %d ms of the cadence sampled %d times in 1000", ms, n)
	}
}

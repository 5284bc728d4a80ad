package synthetic

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

// TestSweepWorstIsTheLargestLagOfTheLastCompleteSweep: the progress line's
// lag during the steady state is the largest one a sweep sampled, each at
// its own sample, held until the next sweep completes, and nothing before
// the first sweep completes. The minimum checkpoint it replaced aged with
// the clock: a sweep of lags of at most 4 s read as 20 s behind.
func TestSweepWorstIsTheLargestLagOfTheLastCompleteSweep(t *testing.T) {
	var w sweepWorst
	w.note(time.Second)
	w.note(4 * time.Second)
	_, ok := w.last()
	require.False(t, ok, "no sweep completed yet")
	w.note(2 * time.Second)
	w.wrap()
	lag, ok := w.last()
	require.True(t, ok)
	require.Equal(t, 4*time.Second, lag)
	// The next sweep's samples do not show until it completes, and it
	// starts afresh: a smaller worst replaces the larger one.
	w.note(300 * time.Millisecond)
	lag, _ = w.last()
	require.Equal(t, 4*time.Second, lag)
	w.wrap()
	lag, _ = w.last()
	require.Equal(t, 300*time.Millisecond, lag)
}

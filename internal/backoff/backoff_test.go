package backoff

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const ms = time.Millisecond

func TestDelay(t *testing.T) {
	for _, tc := range []struct {
		name      string
		n         int
		base, max time.Duration
		jitter, u float64
		want      time.Duration
	}{
		// Exact doubling with u = 0 (or no jitter).
		{"first", 1, 10 * ms, 5 * time.Second, 0, 0, 10 * ms},
		{"second", 2, 10 * ms, 5 * time.Second, 0, 0, 20 * ms},
		{"third", 3, 10 * ms, 5 * time.Second, 0, 0, 40 * ms},
		{"ninth", 9, 10 * ms, 5 * time.Second, 0, 0, 2560 * ms},
		{"u=0 with jitter", 3, 10 * ms, 5 * time.Second, 0.5, 0, 40 * ms},
		// The cap.
		{"capped", 10, 10 * ms, 5 * time.Second, 0, 0, 5 * time.Second},
		{"cap reached exactly", 7, time.Second, time.Minute, 0, 0, time.Minute},
		{"just under the cap", 6, time.Second, time.Minute, 0, 0, 32 * time.Second},
		{"base above max", 1, 2 * time.Second, time.Second, 0, 0, time.Second},
		{"base equals max", 5, time.Second, time.Second, 0, 0, time.Second},
		// Huge n: no overflow, no long loop.
		{"n=64", 64, 10 * ms, 5 * time.Second, 0, 0, 5 * time.Second},
		{"n=MaxInt", math.MaxInt, 10 * ms, 5 * time.Second, 0, 0, 5 * time.Second},
		{"n=MaxInt, 1ns base", math.MaxInt, 1, time.Hour, 0, 0, time.Hour},
		{"MaxInt64 cap", 200, time.Second, math.MaxInt64, 0, 0, math.MaxInt64},
		{"MaxInt64 cap, 1ns base", math.MaxInt, 1, math.MaxInt64, 0, 0, math.MaxInt64},
		{"62 doublings of 1ns", 63, 1, math.MaxInt64, 0, 0, 1 << 62},
		// n <= 0 counts as the first failure.
		{"n=0", 0, 10 * ms, 5 * time.Second, 0, 0, 10 * ms},
		{"n<0", math.MinInt, 10 * ms, 5 * time.Second, 0, 0, 10 * ms},
		// Jitter shortens by jitter*u.
		{"jitter half", 1, 10 * ms, 5 * time.Second, 0.2, 0.5, 9 * ms},
		{"jitter at the cap", 10, 10 * ms, 5 * time.Second, 0.2, 0.5, 4500 * ms},
		{"full jitter", 2, 10 * ms, 5 * time.Second, 1, 0.25, 15 * ms},
		{"jitter above 1 is 1", 2, 10 * ms, 5 * time.Second, 3, 0.25, 15 * ms},
		{"negative jitter is 0", 2, 10 * ms, 5 * time.Second, -1, 0.5, 20 * ms},
		{"NaN jitter is 0", 2, 10 * ms, 5 * time.Second, math.NaN(), 0.5, 20 * ms},
		{"u=1 ignored", 10, 10 * ms, 5 * time.Second, 0.2, 1, 5 * time.Second},
		{"u<0 ignored", 10, 10 * ms, 5 * time.Second, 0.2, -1, 5 * time.Second},
		{"NaN u ignored", 10, 10 * ms, 5 * time.Second, 0.2, math.NaN(), 5 * time.Second},
		// Degenerate bounds.
		{"zero base", 3, 0, time.Second, 0, 0, 0},
		{"negative base", 3, -time.Second, time.Second, 0, 0, 0},
		{"zero max", 3, time.Second, 0, 0, 0, 0},
		{"negative max", 3, time.Second, -time.Second, 0.2, 0.5, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, Delay(tc.n, tc.base, tc.max, tc.jitter, tc.u))
		})
	}
}

// TestDelayJitterBounds: for any u in [0,1) the delay lies in
// [d*(1-jitter), d], and never exceeds max, even at the largest values.
func TestDelayJitterBounds(t *testing.T) {
	us := []float64{0, 1e-9, 0.1, 0.5, 0.9, math.Nextafter(1, 0)}
	for _, max := range []time.Duration{time.Second, 5 * time.Second, math.MaxInt64} {
		for n := 1; n <= 70; n++ {
			exact := Delay(n, 10*ms, max, 0, 0)
			require.LessOrEqual(t, exact, max)
			require.Positive(t, exact)
			if n > 1 {
				require.GreaterOrEqual(t, exact, Delay(n-1, 10*ms, max, 0, 0), "monotone in n")
			}
			for _, jitter := range []float64{0, 0.2, 0.5, 1} {
				for _, u := range us {
					got := Delay(n, 10*ms, max, jitter, u)
					require.LessOrEqual(t, got, exact, "n %d jitter %v u %v", n, jitter, u)
					lo := float64(exact) * (1 - jitter)
					require.GreaterOrEqual(t, float64(got), lo-1, "n %d jitter %v u %v", n, jitter, u)
					require.GreaterOrEqual(t, got, time.Duration(0))
				}
			}
		}
	}
}

func TestBackoff(t *testing.T) {
	t.Run("doubles from Base to Max and resets", func(t *testing.T) {
		b := Backoff{Base: 20 * ms, Max: 2 * time.Second}
		var got []time.Duration
		for range 9 {
			got = append(got, b.Next())
		}
		require.Equal(t, []time.Duration{20 * ms, 40 * ms, 80 * ms, 160 * ms, 320 * ms, 640 * ms, 1280 * ms,
			2 * time.Second, 2 * time.Second}, got)
		require.Equal(t, 9, b.Failures())
		b.Reset()
		require.Zero(t, b.Failures())
		require.Equal(t, 20*ms, b.Next())
		require.Equal(t, 40*ms, b.Next())
	})
	t.Run("no jitter never draws", func(t *testing.T) {
		b := Backoff{Base: ms, Max: time.Second, Rand: func() float64 { panic("drawn without jitter") }}
		require.Equal(t, ms, b.Next())
		require.Equal(t, 2*ms, b.Next())
	})
	t.Run("jitter draws from Rand", func(t *testing.T) {
		u := 0.0
		draws := 0
		b := Backoff{Base: 100 * ms, Max: time.Second, Jitter: 0.2, Rand: func() float64 { draws++; return u }}
		require.Equal(t, 100*ms, b.Next())
		u = 0.5
		require.Equal(t, 180*ms, b.Next())
		u = 0.25
		require.Equal(t, 380*ms, b.Next())
		require.Equal(t, 3, draws)
	})
	t.Run("default Rand stays within the jitter", func(t *testing.T) {
		b := Backoff{Base: 100 * ms, Max: 400 * ms, Jitter: 0.2}
		for i, exact := range []time.Duration{100 * ms, 200 * ms, 400 * ms, 400 * ms, 400 * ms} {
			d := b.Next()
			require.LessOrEqual(t, d, exact, "try %d", i)
			require.Greater(t, d, exact*8/10-1, "try %d", i)
		}
	})
	t.Run("the zero value waits 0", func(t *testing.T) {
		var b Backoff
		require.Zero(t, b.Next())
	})
	t.Run("the count saturates", func(t *testing.T) {
		b := Backoff{Base: ms, Max: time.Second, n: math.MaxInt}
		require.Equal(t, time.Second, b.Next())
		require.Equal(t, math.MaxInt, b.Failures())
	})
}

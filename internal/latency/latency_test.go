package latency

import (
	"math/rand/v2"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestBucketsCoverEveryValue(t *testing.T) {
	for _, v := range []uint64{0, 1, 7, 8, 9, 15, 16, 17, 100, 1000, 1 << 40, 1<<63 + 5, ^uint64(0)} {
		i := bucketOf(v)
		require.Less(t, i, numBuckets)
		require.LessOrEqual(t, v, upperBound(i), "value %d bucket %d", v, i)
		if i > 0 {
			require.Greater(t, v, upperBound(i-1), "value %d bucket %d", v, i)
		}
	}
}

func TestQuantileWithinBucketError(t *testing.T) {
	var h Histogram
	r := rand.New(rand.NewPCG(1, 1))
	vals := make([]int64, 100_000)
	for i := range vals {
		vals[i] = int64(r.ExpFloat64() * 1000)
		h.RecordValue(vals[i])
	}
	sort.Slice(vals, func(i, j int) bool { return vals[i] < vals[j] })
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999} {
		exact := vals[int(q*float64(len(vals)))-1]
		got := int64(h.Quantile(q))
		require.GreaterOrEqual(t, got, exact, "q=%v", q)
		require.LessOrEqual(t, float64(got), float64(exact)*1.125+1, "q=%v", q)
	}
	require.Equal(t, time.Duration(vals[len(vals)-1]), h.Max())
	require.Equal(t, uint64(len(vals)), h.Count())
	require.Equal(t, h.Max(), h.Quantile(1))
	h.Reset()
	require.Zero(t, h.Quantile(0.5))
	require.Zero(t, h.Mean())
}

func TestConcurrentRecord(t *testing.T) {
	var h Histogram
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 10_000 {
				h.Record(time.Duration(g*10_000 + i))
			}
		})
	}
	wg.Wait()
	require.Equal(t, uint64(40_000), h.Count())
	require.Equal(t, time.Duration(39_999), h.Max())
}

func BenchmarkRecord(b *testing.B) {
	var h Histogram
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		h.RecordValue(int64(i & 0xffff))
	}
}

package promutil

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRegisterAllOrNone(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	a := prometheus.NewCounter(prometheus.CounterOpts{Name: "a_total", Help: "a"})
	b := prometheus.NewCounter(prometheus.CounterOpts{Name: "b_total", Help: "b"})
	require.NoError(t, RegisterAll(nil, a, b))
	require.NoError(t, RegisterAll(reg, a))
	// b is new but a collides: neither stays registered by this call.
	b2 := prometheus.NewCounter(prometheus.CounterOpts{Name: "b_total", Help: "b"})
	require.Error(t, RegisterAll(reg, b2, a))
	require.NoError(t, RegisterAll(reg, b), "b2 was rolled back")
	UnregisterAll(reg, a, b)
	UnregisterAll(nil, a)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	require.Empty(t, mfs)
}

// TestSumAddsEverySeriesOfOneName: counters and gauges of the name are
// summed over their series; other names do not count; an absent name is
// zero series.
func TestSumAddsEverySeriesOfOneName(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "c_total"}, []string{"l"})
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "g"})
	require.NoError(t, RegisterAll(reg, c, g))
	c.WithLabelValues("a").Add(2)
	c.WithLabelValues("b").Add(3)
	g.Set(7)
	sum, n, err := Sum(reg, "c_total")
	require.NoError(t, err)
	require.Equal(t, 5.0, sum)
	require.Equal(t, 2, n)
	sum, n, err = Sum(reg, "g")
	require.NoError(t, err)
	require.Equal(t, 7.0, sum)
	require.Equal(t, 1, n)
	_, n, err = Sum(reg, "absent")
	require.NoError(t, err)
	require.Zero(t, n)
}

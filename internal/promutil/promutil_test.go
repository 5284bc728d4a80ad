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

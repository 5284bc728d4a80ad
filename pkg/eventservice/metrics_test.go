package eventservice

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

// TestMetricsLintAndRegistration: every collector passes client_golang's
// linter after real traffic, and a second service on the same registry
// fails with an error while the first service's metrics stay registered
// (Unregister matches by descriptor, so undoing a failed registration must
// touch only what that registration added).
func TestMetricsLintAndRegistration(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	h := newHarness(t, func(o *Options) { o.Registerer = reg }, hooks{})
	id := h.register(1, 1)
	h.advanceSchema(20)
	h.push(1, 20, row("a", 5, 10))
	h.check.waitResolved(id, 20)

	for _, c := range h.svc.metrics.collectors() {
		problems, err := testutil.CollectAndLint(c)
		require.NoError(t, err)
		require.Empty(t, problems)
	}
	require.Positive(t, testutil.ToFloat64(h.svc.metrics.scannedRows))

	opts := h.svc.opts
	opts.Registerer = reg
	_, err := New(opts)
	require.Error(t, err)
	n, err := testutil.GatherAndCount(reg, "cdcflow_eventservice_scanned_rows_total")
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

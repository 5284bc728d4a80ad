package synthetic

import (
	"context"
	"io"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/promutil"
)

// TestFreshBytesReachesTheStore: --fresh-bytes -1 makes the store write
// every row to pebble (none kept in memory only), while the default keeps
// the rows of dispatchers that keep up in memory only (write-behind), so
// the flag is what the store runs with. The counters are read once the run
// delivered everything (runHooks.finished).
func TestFreshBytesReachesTheStore(t *testing.T) {
	for _, fresh := range []int64{-1, DefaultFreshBytes} {
		cfg := smallConfig()
		cfg.FreshBytes = fresh
		var written, deferred float64
		sum, err := run(context.Background(), cfg, io.Discard, io.Discard, runHooks{finished: func(reg prometheus.Gatherer) {
			written = counterValue(t, reg, "cdcflow_eventstore_rows_written_total")
			deferred = counterValue(t, reg, "cdcflow_eventstore_rows_deferred_total")
		}})
		require.NoError(t, err)
		require.True(t, sum.Verified, "--fresh-bytes %d: %+v", fresh, sum.Problems)
		require.Positive(t, sum.RowsUpstream)
		// The changefeeds' dispatchers of one table share its subscription:
		// the store takes each upstream row once.
		require.Equal(t, float64(sum.RowsUpstream)/float64(cfg.Changefeeds), written+deferred,
			"--fresh-bytes %d: every row is written or deferred once", fresh)
		if fresh == -1 {
			require.Zero(t, deferred, "--fresh-bytes -1 keeps no row in memory only")
		} else {
			require.Positive(t, deferred, "the default keeps the rows of dispatchers that keep up in memory only")
		}
	}
}

// counterValue is the sum of the counter name's series on reg (0 if
// absent).
func counterValue(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	v, _, err := promutil.Sum(reg, name)
	require.NoError(t, err)
	return v
}

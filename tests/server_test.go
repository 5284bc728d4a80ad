package tests

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/server"
)

// serverConfig returns a quiet server configuration for tests: no metrics
// listener, no progress line, errors-only logs.
func serverConfig(t *testing.T, tables int, rate int, d time.Duration) server.Config {
	cfg := server.DefaultConfig()
	cfg.Tables, cfg.Rate, cfg.Duration = tables, rate, d
	cfg.DrainTimeout = scaled(t, 3*time.Minute)
	cfg.MetricsAddr, cfg.ProgressInterval, cfg.LogLevel = "", 0, "error"
	return cfg
}

// runServer runs the whole server (generator -> pebble store on disk ->
// service -> transport -> collector) and returns its verified summary.
func runServer(t *testing.T, cfg server.Config) server.Summary {
	t.Helper()
	var out, errOut bytes.Buffer
	sum, err := server.Run(context.Background(), cfg, &out, &errOut)
	require.NoError(t, err, "stderr: %s", errOut.String())
	t.Logf("server summary:\n%s", out.String())
	if !sum.Verified {
		t.Logf("stderr tail: %s", tail(errOut.String(), 4000))
	}
	return sum
}

// requireDelivered checks the per-dispatcher verdict of the server's
// verification: every epoch in order without duplicates, the deduplicated
// union equal to the upstream's rows, the DDLs as scheduled, and every
// final checkpoint at the upstream's final resolved-ts (no lost wakeup).
func requireDelivered(t *testing.T, sum server.Summary, dispatchers int) {
	t.Helper()
	require.Empty(t, sum.Problems)
	require.True(t, sum.Verified, "verification failed")
	require.True(t, sum.Complete, "delivery completed")
	require.Equal(t, dispatchers, sum.Dispatchers)
	require.Zero(t, sum.LostWakeups, "lost wakeups")
	require.Zero(t, sum.OrderViolations, "order violations")
	require.Zero(t, sum.Duplicates, "duplicates within an epoch")
	require.Zero(t, sum.MissingRows, "missing rows")
	require.Zero(t, sum.UnexpectedRows, "unexpected rows")
	require.Zero(t, sum.DDLMismatches, "DDL mismatches")
	require.Positive(t, sum.RowsUpstream)
	require.Equal(t, sum.RowsUpstream, sum.RowsDelivered)
	require.Equal(t, sum.DDLsUpstream, sum.DDLsDelivered)
	// Queues bounded by the number of dispatchers, not by notifications.
	require.LessOrEqual(t, sum.PeakPendingPrep, dispatchers)
}

// TestTransportFaultsServer runs the server with a transport that refuses,
// fails and silently drops sends at random. Refusals and failures must back
// the dispatcher off and re-read from the store; drops must be detected by
// the collector's seq check (or revealed by a keepalive), reset the
// dispatcher, and recover fully.
func TestTransportFaultsServer(t *testing.T) {
	cfg := serverConfig(t, 1000, 6000, scaled(t, 3*time.Second))
	cfg.RefuseRate, cfg.FailRate, cfg.DropRate = 0.05, 0.03, 0.02
	cfg.Seed = scenarioSeed(t, 7)
	s := &scenario{name: "transport faults (server)", dispatchers: cfg.Tables}
	report(t, s)
	sum := runServer(t, cfg)
	s.rows, s.resets = sum.RowsDelivered, sum.Resets
	s.faults = fmtFaults("refuse/fail/drop %.0f/%.0f/%.0f%%: %d injected", 100*cfg.RefuseRate, 100*cfg.FailRate, 100*cfg.DropRate, sum.FaultsInjected)
	requireDelivered(t, sum, cfg.Tables)
	require.Positive(t, sum.FaultsInjected)
	require.Positive(t, sum.Resets, "dropped messages must lead to resets through the seq check")
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

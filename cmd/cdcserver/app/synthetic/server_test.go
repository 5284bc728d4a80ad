package synthetic

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func smallConfig() Config {
	c := DefaultConfig()
	c.Tables, c.Changefeeds, c.Rate, c.Duration = 20, 2, 2000, 1500*time.Millisecond
	c.DDLInterval = 100 * time.Millisecond
	c.ProgressInterval = 0
	c.MetricsAddr = ""
	c.LogLevel = "error"
	return c
}

func TestConfigValidateReportsEveryField(t *testing.T) {
	c := Config{Tables: 0, Changefeeds: 0, Rate: -1, TxnRows: 0, RowBytes: -1, HotFraction: 2, RefuseRate: 0.6, FailRate: 0.6,
		DropRate: 2, Duration: 0, DrainTimeout: 0, DDLInterval: -1, MoveInterval: -1, ResolvedInterval: -1, ResolvedGroupTables: 0, ProgressInterval: -1, PrepareWorkers: 0, ScanWorkers: 0,
		ScanQueue: 0, ScanLimitBytes: 0, InboxCapacity: 1, FreshBytes: 5, DurableSink: true, MetricsAddr: "0.0.0.0:9090", LogLevel: "loud"}
	err := c.Validate()
	require.ErrorIs(t, err, ErrInvalidConfig)
	for _, flag := range []string{"--tables", "--changefeeds", "--rate", "--txn-rows", "--row-bytes", "--hot-fraction",
		"--refuse-rate + --fail-rate", "--drop-rate", "--duration", "--drain-timeout", "--ddl-interval", "--move-interval", "--resolved-interval", "--resolved-group-tables", "--progress-interval",
		"--prepare-workers", "--scan-workers", "--scan-queue", "--scan-limit-bytes", "--inbox-capacity", "--fresh-bytes", "--durable-sink needs",
		"loopback", "--log-level"} {
		require.Contains(t, err.Error(), flag)
	}
	require.NoError(t, DefaultConfig().Validate())
	c = DefaultConfig()
	c.MemoryLimit, c.GCPercent = 1<<20, 5
	err = c.Validate()
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.Contains(t, err.Error(), "--memory-limit")
	require.Contains(t, err.Error(), "--gc-percent")
}

// --memory-limit holds while the server runs (read at the run's end,
// before anything stops) and the previous limit is back once Run returns.
func TestMemoryLimitHoldsWhileTheServerRuns(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	cfg := smallConfig()
	cfg.Duration = 300 * time.Millisecond
	cfg.MemoryLimit = 5 << 30
	var during int64
	_, err := run(context.Background(), cfg, io.Discard, io.Discard, runHooks{beforeStop: func() { during = debug.SetMemoryLimit(-1) }})
	require.NoError(t, err)
	require.Equal(t, int64(5<<30), during)
	require.Equal(t, before, debug.SetMemoryLimit(-1))
}

func TestDDLScheduleIsDeterministic(t *testing.T) {
	start := common.ComposeTs(1_700_000_000_000, 0)
	a := ddlSchedule{seed: 7, tables: 50, interval: 100 * time.Millisecond, start: start, end: start + common.ComposeTs(2000, 0)}
	b := a
	got := a.until(0, a.end)
	require.Len(t, got, 20)
	require.Equal(t, got, b.until(0, b.end))
	var perTable int
	for tb := int64(1); tb <= 50; tb++ {
		perTable += len(a.forTable(tb, 0, a.end))
	}
	require.Equal(t, 20, perTable)
	for i := 1; i < len(got); i++ {
		require.Greater(t, got[i].CommitTs, got[i-1].CommitTs)
	}
	c := a
	c.seed = 8
	require.NotEqual(t, got, c.until(0, c.end), "the seed picks the tables")
	require.Empty(t, ddlSchedule{interval: 0}.until(0, a.end))

	// A window anywhere in the run holds exactly the schedule's DDLs in it
	// (until starts its walk near from, not at the run's first DDL).
	for from := start - 1; from < a.end; from += common.ComposeTs(37, 5) {
		for _, width := range []common.Ts{0, 1, common.ComposeTs(100, 0), common.ComposeTs(250, 3)} {
			var want []schemastore.DDL
			for _, dl := range got {
				if dl.CommitTs > from && dl.CommitTs <= from+width {
					want = append(want, dl)
				}
			}
			require.Equal(t, want, a.until(from, from+width), "(%v, %v]", from, from+width)
		}
	}
}

func TestRunVerifiesAndPrintsJSON(t *testing.T) {
	cfg := smallConfig()
	cfg.JSON = true
	var out, errOut bytes.Buffer
	sum, err := Run(context.Background(), cfg, &out, &errOut)
	require.NoError(t, err)
	require.True(t, sum.Verified, "%+v", sum.Problems)
	require.Equal(t, 40, sum.Dispatchers)
	require.Positive(t, sum.RowsUpstream)
	require.Equal(t, sum.RowsUpstream, sum.RowsDelivered)
	require.Positive(t, sum.DDLsUpstream)
	require.Equal(t, sum.DDLsUpstream, sum.DDLsDelivered)
	// The collectors' sinks told when the last dispatcher passed the
	// upstream's start (warmup.go), and lag was sampled after it.
	require.True(t, sum.Warm)
	require.Positive(t, sum.WarmupSec)
	var decoded map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &decoded), out.String())
	for _, k := range []string{"verified", "dispatchers", "rows_upstream", "rows_delivered", "rows_per_sec", "resets",
		"lost_wakeups", "order_violations", "duplicates", "notify_ns", "resolved_lag_ms", "peak_pending_tasks"} {
		require.Contains(t, decoded, k)
	}
	for _, k := range []string{"notify_ns", "resolved_lag_ms"} {
		q := decoded[k].(map[string]any)
		require.Contains(t, q, "p50")
		require.Contains(t, q, "p99")
		require.Contains(t, q, "max")
	}
	require.Equal(t, 1, strings.Count(strings.TrimSpace(out.String()), "\n")+1, "exactly one JSON object on stdout")
}

func TestRunWithFaultsResetsAndRecovers(t *testing.T) {
	cfg := smallConfig()
	cfg.RefuseRate, cfg.FailRate, cfg.DropRate = 0.1, 0.05, 0.05
	var out bytes.Buffer
	sum, err := Run(context.Background(), cfg, &out, io.Discard)
	require.NoError(t, err)
	require.True(t, sum.Verified, "%v", sum.Problems)
	require.Positive(t, sum.FaultsInjected)
	require.Positive(t, sum.Resets, "drops are detected by the seq check")
	require.Contains(t, out.String(), "VERIFIED")
}

func TestRunWithMovesVerifies(t *testing.T) {
	cfg := smallConfig()
	cfg.MoveInterval = 10 * time.Millisecond
	var out bytes.Buffer
	sum, err := Run(context.Background(), cfg, &out, io.Discard)
	require.NoError(t, err)
	require.True(t, sum.Verified, "%v", sum.Problems)
	require.Positive(t, sum.Moves)
	require.Contains(t, out.String(), fmt.Sprintf("moves %d", sum.Moves))
}

func TestRunInterruptedStillVerifies(t *testing.T) {
	cfg := smallConfig()
	cfg.Duration = time.Hour // only the interruption ends it
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	sum, err := Run(ctx, cfg, io.Discard, io.Discard)
	require.NoError(t, err)
	require.True(t, sum.Interrupted)
	require.True(t, sum.Verified, "%v", sum.Problems)
}

func TestMetricsEndpointServesLintCleanMetrics(t *testing.T) {
	cfg := smallConfig()
	cfg.MetricsAddr = "127.0.0.1:0"
	s, err := build(cfg, io.Discard)
	require.NoError(t, err)
	defer s.cleanup()
	require.NoError(t, s.start(io.Discard))
	defer s.stop(io.Discard)
	// Every metric of every component, on one registry, passes the linter.
	problems, err := testutil.GatherAndLint(s.reg)
	require.NoError(t, err)
	require.Empty(t, problems)
	resp, err := http.Get("http://" + s.metricsAddr() + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	for _, name := range []string{"cdcflow_eventstore_notify_duration_seconds", "cdcflow_eventservice_pending_tasks",
		"cdcflow_eventcollector_rows_applied_total", "cdcflow_eventservice_resolved_set_adds_total"} {
		require.Contains(t, string(body), name)
	}
	resp, err = http.Get("http://" + s.metricsAddr() + "/debug/pprof/")
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.NoError(t, resp.Body.Close())
}

func TestDurableSinkResumeOnSameDataDir(t *testing.T) {
	cfg := smallConfig()
	cfg.Changefeeds = 1
	cfg.DurableSink, cfg.DataDir = true, t.TempDir()
	sum, err := Run(context.Background(), cfg, io.Discard, io.Discard)
	require.NoError(t, err)
	require.True(t, sum.Verified, "%v", sum.Problems)
	first := sum.RowsDelivered
	// A second run on the same directory resumes from the checkpoints (the
	// workload already ended) and verifies the same sink content.
	sum, err = Run(context.Background(), cfg, io.Discard, io.Discard)
	require.NoError(t, err)
	require.True(t, sum.Verified, "%v", sum.Problems)
	require.Equal(t, first, sum.RowsDelivered)
	// Another workload on the same directory is refused.
	cfg.Seed++
	_, err = Run(context.Background(), cfg, io.Discard, io.Discard)
	require.ErrorIs(t, err, ErrInvalidConfig)
}

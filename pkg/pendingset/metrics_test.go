package pendingset

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
)

func newMetricsSet(t *testing.T, reg prometheus.Registerer, target string) (*Set[int, uint64], interface{ Advance(time.Duration) }) {
	t.Helper()
	s, clk := newTestSet(t, func(o *Options[int, uint64]) {
		o.Registerer = reg
		o.MetricsPrefix = "eventservice_resolved_ts"
		o.ConstLabels = prometheus.Labels{"target": target}
	})
	return s, clk
}

// Two sets share one registry through ConstLabels, and the metrics pass
// the Prometheus linter.
func TestMetricsLintAndSharedRegistry(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	a, _ := newMetricsSet(t, reg, "a")
	b, _ := newMetricsSet(t, reg, "b")
	a.Add(1, 1)
	b.Add(1, 1)
	require.NoError(t, a.Complete(a.Drain(0, nil), nil))
	problems, err := testutil.CollectAndLint(a.metrics)
	require.NoError(t, err)
	require.Empty(t, problems)
	problems, err = testutil.GatherAndLint(reg)
	require.NoError(t, err)
	require.Empty(t, problems)
	n, err := testutil.GatherAndCount(reg, "eventservice_resolved_ts_adds_total")
	require.NoError(t, err)
	require.Equal(t, 2, n, "one series per set")

	// Same prefix and labels collide: New reports the registry's error.
	_, err = New(Options[int, uint64]{Merge: maxMerge, Registerer: reg,
		MetricsPrefix: "eventservice_resolved_ts", ConstLabels: prometheus.Labels{"target": "a"}})
	var are prometheus.AlreadyRegisteredError
	require.True(t, errors.As(err, &are), "%v", err)

	require.True(t, a.Unregister())
	n, err = testutil.GatherAndCount(reg, "eventservice_resolved_ts_adds_total")
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = New(Options[int, uint64]{Merge: maxMerge, Registerer: reg,
		MetricsPrefix: "eventservice_resolved_ts", ConstLabels: prometheus.Labels{"target": "a"}})
	require.NoError(t, err, "the name is free again")
}

// The exported metrics carry exactly the Stats numbers, and the
// histograms measure fake-clock time.
func TestMetricsValues(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	s, clk := newMetricsSet(t, reg, "a")
	s.Add(1, 1)
	s.Add(1, 2) // coalesced
	s.Add(2, 1)
	clk.Advance(time.Millisecond)
	b := s.Drain(0, nil)
	require.Empty(t, s.Drain(0, nil))
	clk.Advance(3 * time.Millisecond)
	setResults(b, FailedKey, 1)
	require.NoError(t, s.Complete(b, nil))

	want := `
# HELP eventservice_resolved_ts_adds_total Add calls.
# TYPE eventservice_resolved_ts_adds_total counter
eventservice_resolved_ts_adds_total{target="a"} 3
# HELP eventservice_resolved_ts_coalesced_adds_total Adds merged into a value still undelivered; coalesced_adds_total/adds_total is the coalescing ratio.
# TYPE eventservice_resolved_ts_coalesced_adds_total counter
eventservice_resolved_ts_coalesced_adds_total{target="a"} 1
# HELP eventservice_resolved_ts_drains_total Drain calls.
# TYPE eventservice_resolved_ts_drains_total counter
eventservice_resolved_ts_drains_total{target="a"} 2
# HELP eventservice_resolved_ts_empty_drains_total Drain calls that found nothing ready.
# TYPE eventservice_resolved_ts_empty_drains_total counter
eventservice_resolved_ts_empty_drains_total{target="a"} 1
# HELP eventservice_resolved_ts_delivered_keys_total Keys completed as delivered.
# TYPE eventservice_resolved_ts_delivered_keys_total counter
eventservice_resolved_ts_delivered_keys_total{target="a"} 1
# HELP eventservice_resolved_ts_retries_total Keys put back for retry, by class: batch (whole-batch failure, no budget), key (per-key failure, budget spent), key_transient (per-key, no budget).
# TYPE eventservice_resolved_ts_retries_total counter
eventservice_resolved_ts_retries_total{class="batch",target="a"} 0
eventservice_resolved_ts_retries_total{class="key",target="a"} 1
eventservice_resolved_ts_retries_total{class="key_transient",target="a"} 0
# HELP eventservice_resolved_ts_pending_keys Distinct keys held in any state (ready, in flight, backing off, quarantined).
# TYPE eventservice_resolved_ts_pending_keys gauge
eventservice_resolved_ts_pending_keys{target="a"} 1
# HELP eventservice_resolved_ts_backoff_keys Keys waiting out a per-key backoff.
# TYPE eventservice_resolved_ts_backoff_keys gauge
eventservice_resolved_ts_backoff_keys{target="a"} 1
# HELP eventservice_resolved_ts_quarantined_keys Keys in quarantine.
# TYPE eventservice_resolved_ts_quarantined_keys gauge
eventservice_resolved_ts_quarantined_keys{target="a"} 0
`
	names := []string{"adds_total", "coalesced_adds_total", "drains_total", "empty_drains_total",
		"delivered_keys_total", "retries_total", "pending_keys", "backoff_keys", "quarantined_keys"}
	for i := range names {
		names[i] = "eventservice_resolved_ts_" + names[i]
	}
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want), names...))

	mfs, err := reg.Gather()
	require.NoError(t, err)
	hist := map[string]*dto.Histogram{}
	for _, mf := range mfs {
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			hist[strings.TrimPrefix(mf.GetName(), "eventservice_resolved_ts_")] = mf.GetMetric()[0].GetHistogram()
		}
	}
	require.Equal(t, uint64(1), hist["batch_size"].GetSampleCount())
	require.Equal(t, 2.0, hist["batch_size"].GetSampleSum())
	// One insertion in latencySampleEvery is timestamped: key 1's, not 2's.
	require.Equal(t, uint64(1), hist["queue_latency_seconds"].GetSampleCount())
	require.InDelta(t, 0.001, hist["queue_latency_seconds"].GetSampleSum(), 1e-12)
	require.Equal(t, uint64(1), hist["delivery_duration_seconds"].GetSampleCount())
	require.InDelta(t, 0.003, hist["delivery_duration_seconds"].GetSampleSum(), 1e-12)
}

package eventstore

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdcflow/eventservice/internal/promutil"
)

// metrics are the store's Prometheus collectors. They are created per Store
// and registered on Options.Registerer only; nothing is global.
type metrics struct {
	rowsWritten     prometheus.Counter
	bytesWritten    prometheus.Counter
	rowsDeferred    prometheus.Counter
	bytesDeferred   prometheus.Counter
	rowsSpilled     prometheus.Counter
	bytesSpilled    prometheus.Counter
	writeBatch      prometheus.Histogram
	notifyDuration  prometheus.Histogram
	notifications   prometheus.Counter
	subscriptions   prometheus.Gauge
	dispatchers     prometheus.Gauge
	resolvedLag     prometheus.Histogram
	rejectedRows    *prometheus.CounterVec
	gcRangesDeleted prometheus.Counter
	gcRounds        prometheus.Counter
	subsRemoved     prometheus.Counter
	scans           *prometheus.CounterVec
	scansFresh      prometheus.Counter // scans' children, resolved once: a scan is hot
	scansPebble     prometheus.Counter
	freshDropped    prometheus.Counter
	freshBytes      prometheus.GaugeFunc
}

const (
	namespace = "cdcflow"
	subsystem = "eventstore"

	rejectBeforeResolved = "before_resolved"
	rejectOutsideSpan    = "outside_span"
	rejectInvalid        = "invalid"

	scanFromMemory = "memory"
	scanFromPebble = "pebble"
)

func newMetrics(fresh *freshBudget) *metrics {
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: namespace, Subsystem: subsystem, Name: name, Help: help}
	}
	m := &metrics{
		rowsWritten:  prometheus.NewCounter(prometheus.CounterOpts(opts("rows_written_total", "Rows committed to pebble."))),
		bytesWritten: prometheus.NewCounter(prometheus.CounterOpts(opts("bytes_written_total", "Encoded key and value bytes committed to pebble."))),
		rowsDeferred: prometheus.NewCounter(prometheus.CounterOpts(opts("rows_deferred_total",
			"Rows kept in memory only at their commit (a write-behind subscription, every scan of which reads memory)."))),
		bytesDeferred: prometheus.NewCounter(prometheus.CounterOpts(opts("bytes_deferred_total",
			"Encoded key and value bytes of the rows in rows_deferred_total."))),
		rowsSpilled: prometheus.NewCounter(prometheus.CounterOpts(opts("rows_spilled_total",
			"Rows written to pebble after their commit: a write-behind subscription's fresh rows before they leave memory while still scannable (some may have been written before; also in rows_written_total)."))),
		bytesSpilled: prometheus.NewCounter(prometheus.CounterOpts(opts("bytes_spilled_total",
			"Encoded key and value bytes of the rows in rows_spilled_total (also in bytes_written_total)."))),
		writeBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "write_batch_duration_seconds",
			Help:    "Time to encode and commit one pebble batch.",
			Buckets: prometheus.ExponentialBuckets(10e-6, 4, 10),
		}),
		notifyDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "notify_duration_seconds",
			Help:    "Real time spent inside one dispatcher notifier callback (one callback in 8 of each dispatcher is timed).",
			Buckets: prometheus.ExponentialBuckets(50e-9, 4, 12),
		}),
		notifications: prometheus.NewCounter(prometheus.CounterOpts(opts("notifications_total", "Notifier callbacks invoked."))),
		subscriptions: prometheus.NewGauge(prometheus.GaugeOpts(opts("subscriptions", "Live upstream subscriptions."))),
		dispatchers:   prometheus.NewGauge(prometheus.GaugeOpts(opts("dispatchers", "Registered dispatchers."))),
		resolvedLag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "resolved_lag_seconds",
			Help:    "Physical lag behind the clock of the oldest resolved-ts a write batch advanced a subscription to, observed once per batch with advances.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}),
		rejectedRows: prometheus.NewCounterVec(prometheus.CounterOpts(opts("rejected_rows_total",
			"Rows refused at Push, by reason (before_resolved, outside_span, invalid).")), []string{"reason"}),
		gcRangesDeleted: prometheus.NewCounter(prometheus.CounterOpts(opts("gc_ranges_deleted_total", "Range deletions issued by checkpoint GC."))),
		gcRounds:        prometheus.NewCounter(prometheus.CounterOpts(opts("gc_rounds_total", "Checkpoint GC rounds that deleted ranges, each written as one pebble batch."))),
		subsRemoved:     prometheus.NewCounter(prometheus.CounterOpts(opts("subscriptions_removed_total", "Idle subscriptions ended and deleted."))),
		scans: prometheus.NewCounterVec(prometheus.CounterOpts(opts("scans_total",
			"Iterators opened, by what served them (memory: the subscription's fresh rows; pebble).")), []string{"from"}),
		freshDropped: prometheus.NewCounter(prometheus.CounterOpts(opts("fresh_dropped_total",
			"Times a subscription dropped its fresh rows because FreshBytes was used up."))),
		freshBytes: prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("fresh_bytes",
			"Bytes of fresh rows kept in memory (bounded by FreshBytes).")), func() float64 { return float64(fresh.used.Load()) }),
	}
	m.scansFresh, m.scansPebble = m.scans.WithLabelValues(scanFromMemory), m.scans.WithLabelValues(scanFromPebble)
	for _, r := range []string{rejectBeforeResolved, rejectOutsideSpan, rejectInvalid} {
		m.rejectedRows.WithLabelValues(r)
	}
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.rowsWritten, m.bytesWritten, m.rowsDeferred, m.bytesDeferred, m.rowsSpilled, m.bytesSpilled, m.writeBatch, m.notifyDuration, m.notifications,
		m.subscriptions, m.dispatchers, m.resolvedLag, m.rejectedRows, m.gcRangesDeleted, m.gcRounds, m.subsRemoved,
		m.scans, m.freshDropped, m.freshBytes}
}

func (m *metrics) register(reg prometheus.Registerer) error {
	return promutil.RegisterAll(reg, m.collectors()...)
}

func (m *metrics) unregister(reg prometheus.Registerer) {
	promutil.UnregisterAll(reg, m.collectors()...)
}

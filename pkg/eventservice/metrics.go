package eventservice

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdcflow/eventservice/internal/promutil"
	"github.com/cdcflow/eventservice/pkg/common"
)

const (
	namespace = "cdcflow"
	subsystem = "eventservice"
)

// workerCounters are the notify path's counters for one preparation worker,
// padded to their own cache lines so that notifications of dispatchers on
// different workers do not contend on one word.
type workerCounters struct {
	notifications atomic.Uint64
	coalesced     atomic.Uint64
	_             [112]byte
}

// metrics are the service's Prometheus collectors, per instance.
type metrics struct {
	svc              *Service
	prepareOutcomes  [numOutcomes]prometheus.Counter
	prepareOutcomeV  *prometheus.CounterVec
	scanDuration     prometheus.Histogram
	scannedRows      prometheus.Counter
	scannedBytes     prometheus.Counter
	interruptedScans prometheus.Counter
	deferredScans    prometheus.Counter
	sendRefusals     *prometheus.CounterVec
	sentMessages     prometheus.Counter
	backoffs         prometheus.Counter
	keepalives       prometheus.Counter
	// refusedControl counts control requests refused for a reason of the
	// service's bounds or its authority (not for malformed requests).
	refusedControl *prometheus.CounterVec
	funcs          []prometheus.Collector
}

func newMetrics(svc *Service) *metrics {
	name := func(n string) string { return prometheus.BuildFQName(namespace, subsystem, n) }
	m := &metrics{svc: svc}
	m.prepareOutcomeV = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: name("prepare_outcomes_total"),
		Help: "Preparations by outcome: nothing, fast_path (progress without a scan), scan, schema_blocked, backoff.",
	}, []string{"outcome"})
	for i := range m.prepareOutcomes {
		m.prepareOutcomes[i] = m.prepareOutcomeV.WithLabelValues(outcomeNames[i])
	}
	m.scanDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: name("scan_duration_seconds"), Help: "Duration of one scan task, from store read to transport accept.",
		Buckets: prometheus.ExponentialBuckets(10e-6, 4, 10),
	})
	m.scannedRows = prometheus.NewCounter(prometheus.CounterOpts{Name: name("scanned_rows_total"), Help: "Rows read by scan tasks."})
	m.scannedBytes = prometheus.NewCounter(prometheus.CounterOpts{Name: name("scanned_bytes_total"), Help: "Row bytes read by scan tasks."})
	m.interruptedScans = prometheus.NewCounter(prometheus.CounterOpts{Name: name("interrupted_scans_total"),
		Help: "Scan tasks stopped at a size limit and re-queued for the rest."})
	m.deferredScans = prometheus.NewCounter(prometheus.CounterOpts{Name: name("deferred_scans_total"),
		Help: "Scan tasks put off before reading because their target had no room (at least half its capacity in use); each waits for room, as a refused send does."})
	m.sendRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("send_refusals_total"),
		Help: "Transport sends refused (busy), larger than the target can ever take (too_large) or failed (failed)."}, []string{"reason"})
	m.sendRefusals.WithLabelValues("busy")
	m.sendRefusals.WithLabelValues("too_large")
	m.sendRefusals.WithLabelValues("failed")
	m.sentMessages = prometheus.NewCounter(prometheus.CounterOpts{Name: name("sent_messages_total"), Help: "Messages accepted by the transport."})
	m.backoffs = prometheus.NewCounter(prometheus.CounterOpts{Name: name("backoffs_total"),
		Help: "Dispatchers backed off after their target refused or failed a send, or had no room for a scan."})
	m.keepalives = prometheus.NewCounter(prometheus.CounterOpts{Name: name("keepalives_total"),
		Help: "Resolved-ts re-sent to collectors that had not acknowledged progress for SignalInterval."})
	m.refusedControl = prometheus.NewCounterVec(prometheus.CounterOpts{Name: name("refused_control_requests_total"),
		Help: "Control requests refused: max_targets, max_dispatchers_per_target, max_dispatchers, max_span_key_bytes (bounds of the service), permission_denied (the caller may not act for the target), epoch_jump (a reset too far ahead)."},
		[]string{"reason"})
	for _, r := range refusalReasons {
		m.refusedControl.WithLabelValues(r)
	}

	gauge := func(n, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name(n), Help: help}, f)
	}
	counter := func(n, help string, f func() float64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name(n), Help: help}, f)
	}
	m.funcs = []prometheus.Collector{
		// These read Progress, O(workers); only walkCollector walks the
		// dispatchers, once per scrape.
		counter("notifications_total", "Store notifications received.", func() float64 { return float64(svc.Progress().Notifications) }),
		counter("coalesced_notifications_total", "Notifications absorbed by queued work or recorded as a pending follow-up.",
			func() float64 { return float64(svc.Progress().Coalesced) }),
		gauge("pending_prepare_tasks", "Sessions in the preparation queues.", func() float64 { return float64(svc.Progress().PendingPrepare) }),
		gauge("pending_scan_tasks", "Sessions handed to (or waiting for) the scan channel.", func() float64 { return float64(svc.Progress().PendingScan) }),
		gauge("pending_tasks", "Preparation plus scan tasks pending.", func() float64 {
			p := svc.Progress()
			return float64(p.PendingPrepare + p.PendingScan)
		}),
		gauge("schema_blocked_dispatchers", "Dispatchers parked until the schema frontier advances.", func() float64 { return float64(svc.blocked.len()) }),
		counter("resets_total", "Dispatcher resets accepted.", func() float64 { return float64(svc.resets.Load()) }),
		gauge("targets", "Targets (collectors) with at least one registered dispatcher; at most Options.MaxTargets.",
			func() float64 { return float64(svc.targetCount()) }),
		&walkCollector{svc: svc,
			states: prometheus.NewDesc(name("dispatchers"), "Dispatchers by scan state.", []string{"state"}, nil),
			lag: prometheus.NewDesc(name("resolved_lag_seconds"),
				"Physical lag of the slowest dispatcher's resolved-ts: received from the store, or sent downstream.", []string{"kind"}, nil)},
	}
	return m
}

func (m *metrics) collectors() []prometheus.Collector {
	return append([]prometheus.Collector{m.prepareOutcomeV, m.scanDuration, m.scannedRows, m.scannedBytes,
		m.interruptedScans, m.deferredScans, m.sendRefusals, m.sentMessages, m.backoffs, m.keepalives, m.refusedControl}, m.funcs...)
}

func (m *metrics) register(reg prometheus.Registerer) error {
	return promutil.RegisterAll(reg, m.collectors()...)
}

func (m *metrics) unregister(reg prometheus.Registerer) {
	promutil.UnregisterAll(reg, m.collectors()...)
}

// Reasons of refused_control_requests_total.
const (
	refusedMaxTargets     = "max_targets"
	refusedMaxDispatchers = "max_dispatchers_per_target"
	// refusedMaxDispatchersTotal and refusedSpanKeyBytes: the service-wide
	// bounds.
	refusedMaxDispatchersTotal = "max_dispatchers"
	refusedSpanKeyBytes        = "max_span_key_bytes"
	refusedPermission          = "permission_denied"
	refusedEpochJump           = "epoch_jump"
)

var refusalReasons = []string{refusedMaxTargets, refusedMaxDispatchers, refusedMaxDispatchersTotal, refusedSpanKeyBytes,
	refusedPermission, refusedEpochJump}

// walkCollector reports, at scrape time, what needs a walk over the
// dispatchers: their count by scan state and the resolved-ts lag of the
// slowest. One walk serves both, so a scrape costs one pass (the notify
// path pays nothing for either).
type walkCollector struct {
	svc         *Service
	states, lag *prometheus.Desc
}

func (c *walkCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.states
	ch <- c.lag
}

func (c *walkCollector) Collect(ch chan<- prometheus.Metric) {
	w := c.svc.walk()
	for st := range numStates {
		ch <- prometheus.MustNewConstMetric(c.states, prometheus.GaugeValue, float64(w.states[st]), st.String())
	}
	now := c.svc.opts.Clock.Now()
	lag := func(ts common.Ts) float64 {
		if ts == 0 {
			return 0
		}
		return ts.Lag(now).Seconds()
	}
	ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, lag(w.minReceived), "received")
	ch <- prometheus.MustNewConstMetric(c.lag, prometheus.GaugeValue, lag(w.minSent), "sent")
}

// walkResult is what one pass over the dispatchers finds.
type walkResult struct {
	dispatchers          int
	states               [numStates]int
	minReceived, minSent common.Ts
}

// walk makes one pass over the dispatchers, under Service.mu (read): O(n).
func (svc *Service) walk() walkResult {
	var w walkResult
	svc.mu.RLock()
	defer svc.mu.RUnlock()
	w.dispatchers = svc.mu.dispatchers.Len()
	first := true
	for d := range svc.mu.dispatchers.All() {
		s := d.session.Load()
		state, _ := s.sched.load()
		w.states[state]++
		rec, sent := common.Ts(d.received.Load()), common.Ts(s.sent.Load())
		if first || rec < w.minReceived {
			w.minReceived = rec
		}
		if first || sent < w.minSent {
			w.minSent = sent
		}
		first = false
	}
	return w
}

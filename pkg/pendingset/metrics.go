package pendingset

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Stats is a consistent snapshot of a set's counters (monotonic since New)
// and gauges (current). The Prometheus metrics are read from the same
// snapshot, so tests can assert exact numbers without scraping.
type Stats struct {
	// Adds counts every Add call.
	Adds uint64
	// Coalesced counts adds merged into a value that was still undelivered
	// (ready, dirty, backing off or quarantined); they cost no delivery.
	// Coalesced/Adds is the coalescing ratio.
	Coalesced uint64
	// Drains counts Drain calls; EmptyDrains those that returned nothing.
	Drains, EmptyDrains uint64
	// Drained counts entries handed out by Drain.
	Drained uint64
	// Delivered counts entries completed as Delivered.
	Delivered uint64
	// BatchFailures counts Complete calls with a non-nil error;
	// BatchRetries the keys they put back (no budget spent).
	BatchFailures, BatchRetries uint64
	// KeyFailures counts FailedKey results (budget spent); KeyRetries
	// RetryKey results and invalid Results (no budget).
	KeyFailures, KeyRetries uint64
	// Bypasses counts backoffs cut short by Options.Bypass.
	Bypasses uint64
	// Superseded counts values dropped because the key's last delivered
	// value supersedes them (Options.Supersedes).
	Superseded uint64
	// Bisections counts failing batches the pump split in two to isolate
	// the keys that fail (see Options.BisectAfter and ErrPermanent).
	Bisections uint64
	// Quarantines counts entries into quarantine; Readmissions exits from
	// it after QuarantineRetry.
	Quarantines, Readmissions uint64

	// Len is the number of distinct keys held; MaxLen its high-water mark,
	// which bounds the set's memory (map entries and nodes).
	Len, MaxLen int
	// Idle is the number of delivered keys whose slot is kept mapped for a
	// cheap re-add until a new key needs it; they are not in Len.
	Idle int
	// Ready, InFlight, BackingOff and Quarantined split Len by state.
	Ready, InFlight, BackingOff, Quarantined int
}

// Stats returns a snapshot of the set's counters and gauges.
func (s *Set[K, V]) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.mu.stats
	st.Len, st.MaxLen = s.heldLocked(), s.mu.maxLen
	st.Idle = s.mu.count[stateIdle]
	st.Ready = s.mu.count[stateReady]
	st.InFlight = s.mu.count[stateInFlight]
	st.BackingOff = s.mu.count[stateBackoff]
	st.Quarantined = s.mu.count[stateQuarantined]
	return st
}

// metrics is a set's Prometheus collector. Counters and gauges are not
// updated on the hot path: Collect reads them from one Stats snapshot, so
// Add pays nothing for metrics. Only the three histograms are observed, per
// Drain and per Complete, outside the set's lock. No label carries a key.
type metrics[K comparable, V any] struct {
	set *Set[K, V]

	adds, coalesced, drains, emptyDrains, delivered, batchFailures *prometheus.Desc
	retries, quarantines, readmissions, bypasses                   *prometheus.Desc
	pending, inFlight, backingOff, quarantined                     *prometheus.Desc

	batchSize        prometheus.Histogram
	queueLatency     prometheus.Histogram
	deliveryDuration prometheus.Histogram
}

func newMetrics[K comparable, V any](s *Set[K, V]) *metrics[K, V] {
	p, cl := s.opts.MetricsPrefix, s.opts.ConstLabels
	desc := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(p, "", name), help, labels, cl)
	}
	hist := func(name, help string, buckets []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: prometheus.BuildFQName(p, "", name), Help: help, ConstLabels: cl, Buckets: buckets,
		})
	}
	return &metrics[K, V]{
		set:           s,
		adds:          desc("adds_total", "Add calls."),
		coalesced:     desc("coalesced_adds_total", "Adds merged into a value still undelivered; coalesced_adds_total/adds_total is the coalescing ratio."),
		drains:        desc("drains_total", "Drain calls."),
		emptyDrains:   desc("empty_drains_total", "Drain calls that found nothing ready."),
		delivered:     desc("delivered_keys_total", "Keys completed as delivered."),
		batchFailures: desc("batch_failures_total", "Whole-batch delivery failures (keys kept, no budget spent)."),
		retries:       desc("retries_total", "Keys put back for retry, by class: batch (whole-batch failure, no budget), key (per-key failure, budget spent), key_transient (per-key, no budget).", "class"),
		quarantines:   desc("quarantines_total", "Times a key entered quarantine after exhausting its attempts."),
		readmissions:  desc("readmissions_total", "Times a quarantined key was re-admitted for another attempt."),
		bypasses:      desc("backoff_bypasses_total", "Per-key backoffs cut short because Options.Bypass accepted a fresh value."),
		pending:       desc("pending_keys", "Distinct keys held in any state (ready, in flight, backing off, quarantined)."),
		inFlight:      desc("in_flight_keys", "Keys drained and not yet completed."),
		backingOff:    desc("backoff_keys", "Keys waiting out a per-key backoff."),
		quarantined:   desc("quarantined_keys", "Keys in quarantine."),
		batchSize: hist("batch_size", "Entries per non-empty drain.",
			prometheus.ExponentialBuckets(1, 2, 11)),
		queueLatency: hist("queue_latency_seconds", "Time from the first undelivered add of a key to the drain that hands it out (one add in 13 is sampled).",
			prometheus.ExponentialBuckets(1e-5, 4, 12)),
		deliveryDuration: hist("delivery_duration_seconds", "Time from a drain to the completion of its batch.",
			prometheus.ExponentialBuckets(1e-4, 3, 12)),
	}
}

// Describe implements prometheus.Collector.
func (m *metrics[K, V]) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.adds, m.coalesced, m.drains, m.emptyDrains, m.delivered,
		m.batchFailures, m.retries, m.quarantines, m.readmissions, m.bypasses, m.pending, m.inFlight, m.backingOff, m.quarantined} {
		ch <- d
	}
	m.batchSize.Describe(ch)
	m.queueLatency.Describe(ch)
	m.deliveryDuration.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *metrics[K, V]) Collect(ch chan<- prometheus.Metric) {
	st := m.set.Stats()
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v int) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v))
	}
	counter(m.adds, st.Adds)
	counter(m.coalesced, st.Coalesced)
	counter(m.drains, st.Drains)
	counter(m.emptyDrains, st.EmptyDrains)
	counter(m.delivered, st.Delivered)
	counter(m.batchFailures, st.BatchFailures)
	counter(m.retries, st.BatchRetries, "batch")
	counter(m.retries, st.KeyFailures, "key")
	counter(m.retries, st.KeyRetries, "key_transient")
	counter(m.quarantines, st.Quarantines)
	counter(m.readmissions, st.Readmissions)
	counter(m.bypasses, st.Bypasses)
	gauge(m.pending, st.Len)
	gauge(m.inFlight, st.InFlight)
	gauge(m.backingOff, st.BackingOff)
	gauge(m.quarantined, st.Quarantined)
	m.batchSize.Collect(ch)
	m.queueLatency.Collect(ch)
	m.deliveryDuration.Collect(ch)
}

// observeDrain records a drain's batch size and each entry's queue latency.
func (m *metrics[K, V]) observeDrain(batch []Entry[K, V], now int64) {
	if len(batch) == 0 {
		return
	}
	m.batchSize.Observe(float64(len(batch)))
	for j := range batch {
		if batch[j].since != noStamp {
			m.queueLatency.Observe(time.Duration(now - batch[j].since).Seconds())
		}
	}
}

// observeComplete records the time since the batch was drained (entries of
// one batch come from one drain in the Pump; otherwise the first entry's
// drain is used).
func (m *metrics[K, V]) observeComplete(batch []Entry[K, V], now int64) {
	m.deliveryDuration.Observe(time.Duration(now - batch[0].drained).Seconds())
}

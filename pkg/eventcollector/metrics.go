package eventcollector

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdcflow/eventservice/pkg/messaging"
)

const (
	namespace = "cdcflow"
	subsystem = "eventcollector"
)

// sinkOp labels the sink call timed by the duration histogram.
type sinkOp uint8

const (
	opBegin sinkOp = iota
	opRows
	opDDL
	opCheckpoint
	numSinkOps
)

func (o sinkOp) String() string {
	switch o {
	case opBegin:
		return "begin_epoch"
	case opRows:
		return "apply_rows"
	case opDDL:
		return "apply_ddl"
	default:
		return "checkpoint"
	}
}

// serviceCall and callResult label the calls the collector makes to the
// service on its own initiative.
type serviceCall uint8

const (
	callReset serviceCall = iota
	callHeartbeat
	numServiceCalls
)

func (c serviceCall) String() string {
	if c == callReset {
		return "reset"
	}
	return "heartbeat"
}

type callResult uint8

const (
	resultOK callResult = iota
	resultStale
	resultError
	numCallResults
)

func (r callResult) String() string {
	switch r {
	case resultOK:
		return "ok"
	case resultStale:
		return "stale_epoch"
	default:
		return "error"
	}
}

// metrics exports the collector's counters, read from its atomics at
// scrape time, and times sink calls. Every series carries the target as a
// constant label (one collector per target may share a registry); none is
// per dispatcher.
type metrics struct {
	c            *Collector
	sinkDuration *prometheus.HistogramVec
	sinkObs      [numSinkOps]prometheus.Observer

	messages, rows, resets, ignored, calls, dispatchers, lag *prometheus.Desc
}

func newMetrics(c *Collector) *metrics {
	labels := prometheus.Labels{"target": string(c.opts.Target)}
	name := func(n string) string { return prometheus.BuildFQName(namespace, subsystem, n) }
	desc := func(n, help string, varLabels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name(n), help, varLabels, labels)
	}
	m := &metrics{c: c}
	m.sinkDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: name("sink_duration_seconds"), Help: "Real time spent in one sink call, by operation (of the checkpoint calls resolved-ts batches make, one in 8 is timed).",
		ConstLabels: labels,
		// 1µs .. ~16s: an in-memory sink takes microseconds, a slow
		// downstream seconds.
		Buckets: prometheus.ExponentialBuckets(1e-6, 4, 13),
	}, []string{"op"})
	for op := range numSinkOps {
		m.sinkObs[op] = m.sinkDuration.WithLabelValues(op.String())
	}
	m.messages = desc("messages_received_total", "Messages received from the inbox, by kind.", "kind")
	m.rows = desc("rows_applied_total", "Rows the sink accepted, re-deliveries after a reset included.")
	m.resets = desc("resets_total", "Dispatcher resets, by reason.", "reason")
	m.ignored = desc("ignored_messages_total",
		"Messages ignored: of an older epoch, a resolved-ts overtaken by later messages, of an earlier registration of the dispatcher, of an unknown dispatcher, or a resolved-ts batch of no or too many entries.", "reason")
	m.calls = desc("service_calls_total", "Reset calls, and checkpoints reported in batched heartbeats, by the service's answer.", "call", "result")
	m.dispatchers = desc("dispatchers", "Dispatchers of the collector.")
	m.lag = desc("checkpoint_lag_seconds", "Physical lag of the smallest dispatcher checkpoint; zero with no dispatchers.")
	return m
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.messages, m.rows, m.resets, m.ignored, m.calls, m.dispatchers, m.lag} {
		ch <- d
	}
	m.sinkDuration.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	cnt := &m.c.cnt
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	for i := range numKinds {
		counter(m.messages, cnt.received[i].Load(), messaging.Kind(i+1).String())
	}
	counter(m.rows, cnt.rowsApplied.Load())
	for r := range numResetReasons {
		counter(m.resets, cnt.resets[r].Load(), r.String())
	}
	for r := range numIgnoreReasons {
		counter(m.ignored, cnt.ignored[r].Load(), r.String())
	}
	for call := range numServiceCalls {
		for res := range numCallResults {
			counter(m.calls, cnt.serviceCalls[call][res].Load(), call.String(), res.String())
		}
	}
	st := m.c.Stats()
	ch <- prometheus.MustNewConstMetric(m.dispatchers, prometheus.GaugeValue, float64(st.Dispatchers))
	lag := 0.0
	if st.Dispatchers > 0 {
		lag = st.MinCheckpoint.Lag(m.c.opts.Clock.Now()).Seconds()
	}
	ch <- prometheus.MustNewConstMetric(m.lag, prometheus.GaugeValue, lag)
	m.sinkDuration.Collect(ch)
}

func (m *metrics) observeSink(op sinkOp, d time.Duration) { m.sinkObs[op].Observe(d.Seconds()) }

func (m *metrics) register(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	return reg.Register(m)
}

func (m *metrics) unregister(reg prometheus.Registerer) {
	if reg != nil {
		reg.Unregister(m)
	}
}

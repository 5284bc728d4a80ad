package remote

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdcflow/eventservice/pkg/messaging"
)

const (
	namespace = "cdcflow"
	subsystem = "remote"
)

// clientMetrics are a Client's; the target is a constant label, so the
// clients of one process (one per changefeed) share a registry.
type clientMetrics struct {
	streams   prometheus.Counter
	received  prometheus.Counter
	granted   prometheus.Counter
	deadLinks prometheus.Counter
}

func newClientMetrics(reg prometheus.Registerer, target messaging.Target) (*clientMetrics, error) {
	labels := prometheus.Labels{"target": string(target)}
	m := &clientMetrics{
		streams: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, ConstLabels: labels,
			Name: "client_streams_total", Help: "Data streams opened to the service: 1 plus the reconnects."}),
		received: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, ConstLabels: labels,
			Name: "client_received_messages_total", Help: "Messages received from the service and put in the local inbox."}),
		granted: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, ConstLabels: labels,
			Name: "client_credit_granted_total", Help: "Credit (messages) granted to the service, the opening credit included."}),
		deadLinks: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem, ConstLabels: labels,
			Name: "client_dead_links_total", Help: "Data streams declared dead (nothing from the service for the liveness timeout) and redialled."}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.streams, m.received, m.granted, m.deadLinks} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// serverMetrics are a Server's: counters updated as it works, and gauges
// read from the connected peers at scrape time (O(collectors)).
type serverMetrics struct {
	s            *Server
	streams      *prometheus.CounterVec
	sent         *prometheus.CounterVec
	refused      *prometheus.CounterVec
	notConnected prometheus.Counter
	refusedCalls *prometheus.CounterVec
	refusedConns prometheus.Counter
	deadLinks    prometheus.Counter
	connected    *prometheus.Desc
	credit       *prometheus.Desc
	inFlight     *prometheus.Desc
	controlHeld  *prometheus.Desc
}

func newServerMetrics(s *Server) *serverMetrics {
	name := func(n string) string { return prometheus.BuildFQName(namespace, subsystem, n) }
	m := &serverMetrics{
		s: s,
		streams: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
			Name: "server_streams_total", Help: "Collector data streams opened (a reconnect opens one more)."}, []string{"target"}),
		sent: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
			Name: "server_sent_messages_total", Help: "Messages accepted by Send for a collector (within its credit)."}, []string{"target"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
			Name: "server_refused_sends_total", Help: "Sends refused, by reason: busy (out of credit), unavailable (stream broken), too_large; " +
				"sends to a target that never connected are counted under target \"(not connected)\"."},
			[]string{"target", "reason"}),
		refusedCalls: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
			Name: "server_refused_streams_total", Help: "Data streams and control calls refused before reaching the service, by reason: " +
				"malformed (a hello that does not decode or names an invalid target), version (another wire version), " +
				"permission_denied (the certificate's identity may not serve the target), max_targets, no_hello (none within the liveness timeout), " +
				"control_budget (a Control call beyond MaxControlBytesPerConnection or MaxControlBytesPerIP), control_deadline (a Control request not whole within ControlReceiveTimeout)."}, []string{"reason"}),
		refusedConns: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
			Name: "server_refused_connections_total", Help: "TCP connections closed on accept (MaxConnections or MaxConnectionsPerIP open, MaxHandshakesPerIP in their handshake) " +
				"or before their handshake completed (HandshakeTimeout, or the place taken by a newer one beyond MaxHandshakes)."}),
		deadLinks: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Subsystem: subsystem,
			Name: "server_dead_links_total", Help: "Collector streams declared dead: nothing received, or a send blocked, for the liveness timeout."}),
		connected: prometheus.NewDesc(name("server_connected_collectors"), "Collectors whose data stream is open.", nil, nil),
		credit: prometheus.NewDesc(name("server_credit_messages"),
			"Messages the service may still send to a collector before it grants more.", []string{"target"}, nil),
		inFlight: prometheus.NewDesc(name("server_in_flight_messages"),
			"Messages accepted for a collector and not yet read by it (as the marks it echoes prove): queued, on the wire or in its transport; at most its capacity.", []string{"target"}, nil),
	}
	m.controlHeld = prometheus.NewDesc(name("server_control_held_bytes"),
		"Bytes the Control calls whose requests are arriving may hold (charged against MaxControlBytesPerConnection and MaxControlBytesPerIP).", nil, nil)
	m.notConnected = m.refused.WithLabelValues(notConnectedLabel, "unavailable")
	for _, r := range []string{"malformed", "version", "permission_denied", "max_targets", "no_hello", "control_budget", "control_deadline"} {
		m.refusedCalls.WithLabelValues(r)
	}
	return m
}

// notConnectedLabel is the target label of sends to targets that never
// connected. It cannot clash with a target: '(' and ' ' are not allowed
// in target names.
const notConnectedLabel = "(not connected)"

// forget deletes the series of a target whose broken stream was dropped
// (MaxTargets), so that series stay bounded by MaxTargets too.
func (m *serverMetrics) forget(target string) {
	m.streams.DeleteLabelValues(target)
	m.sent.DeleteLabelValues(target)
	m.refused.DeletePartialMatch(prometheus.Labels{"target": target})
}

// peerCounters are one target's series, created when its collector
// connects (so they are scraped, at zero, before the first send or
// refusal) and kept by its stream, so that Send does no label lookup.
type peerCounters struct {
	sent, busy, unavailable, tooLarge prometheus.Counter
}

func (m *serverMetrics) forTarget(target string) peerCounters {
	return peerCounters{sent: m.sent.WithLabelValues(target), busy: m.refused.WithLabelValues(target, "busy"),
		unavailable: m.refused.WithLabelValues(target, "unavailable"), tooLarge: m.refused.WithLabelValues(target, "too_large")}
}

// Describe implements prometheus.Collector.
func (m *serverMetrics) Describe(ch chan<- *prometheus.Desc) {
	m.streams.Describe(ch)
	m.sent.Describe(ch)
	m.refused.Describe(ch)
	m.refusedCalls.Describe(ch)
	m.refusedConns.Describe(ch)
	m.deadLinks.Describe(ch)
	ch <- m.connected
	ch <- m.credit
	ch <- m.inFlight
	ch <- m.controlHeld
}

// Collect implements prometheus.Collector.
func (m *serverMetrics) Collect(ch chan<- prometheus.Metric) {
	m.streams.Collect(ch)
	m.sent.Collect(ch)
	m.refused.Collect(ch)
	m.refusedCalls.Collect(ch)
	m.refusedConns.Collect(ch)
	m.deadLinks.Collect(ch)
	connected := 0
	for _, p := range m.s.peers() {
		p.mu.Lock()
		credit, inFlight, broken := p.mu.credit.available(), p.mu.credit.inFlight(), p.mu.broken != nil
		p.mu.Unlock()
		if broken {
			continue
		}
		connected++
		ch <- prometheus.MustNewConstMetric(m.credit, prometheus.GaugeValue, float64(credit), string(p.target))
		ch <- prometheus.MustNewConstMetric(m.inFlight, prometheus.GaugeValue, float64(inFlight), string(p.target))
	}
	ch <- prometheus.MustNewConstMetric(m.connected, prometheus.GaugeValue, float64(connected))
	held, _, _, _ := m.s.ctl.held()
	ch <- prometheus.MustNewConstMetric(m.controlHeld, prometheus.GaugeValue, float64(held))
}

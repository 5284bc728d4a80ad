package cluster

import (
	"github.com/prometheus/client_golang/prometheus"
)

// memberMetrics are a node's membership's (cdcflow_cluster_*).
type memberMetrics struct {
	valid     prometheus.GaugeFunc
	keepalive prometheus.Histogram
}

func newMemberMetrics(m *Member, reg prometheus.Registerer) (*memberMetrics, error) {
	mm := &memberMetrics{
		valid: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "cdcflow", Subsystem: "cluster", Name: "membership_valid",
			Help: "1 while this node's membership is valid (its lease kept alive and its local deadline ahead), else 0: it runs no changefeed"},
			func() float64 {
				if m.Valid() {
					return 1
				}
				return 0
			}),
		keepalive: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "cdcflow", Subsystem: "cluster", Name: "lease_keepalive_seconds",
			Help:    "Round trip of the node's lease keepalives to etcd (acknowledged ones)",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}}),
	}
	if reg == nil {
		return mm, nil
	}
	for _, c := range []prometheus.Collector{mm.valid, mm.keepalive} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return mm, nil
}

// coordinatorMetrics are the coordinator's (cdcflow_cluster_*): what it
// saw and decided at its last round, 0 on a node that does not coordinate.
type coordinatorMetrics struct {
	coordinator prometheus.Gauge
	nodes       prometheus.Gauge
	changefeeds *prometheus.GaugeVec // by desired state
	unplaced    prometheus.Gauge
	assigned    *prometheus.GaugeVec // by node
	moves       *prometheus.CounterVec
}

func newCoordinatorMetrics(reg prometheus.Registerer) (*coordinatorMetrics, error) {
	cm := &coordinatorMetrics{
		coordinator: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "cdcflow", Subsystem: "cluster", Name: "coordinator",
			Help: "1 while this node is the coordinator, else 0 (the cluster's sum is 1 when healthy)"}),
		nodes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "cdcflow", Subsystem: "cluster", Name: "live_nodes",
			Help: "Live nodes at the coordinator's last round (0 on other nodes)"}),
		changefeeds: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "cdcflow", Subsystem: "cluster", Name: "changefeeds",
			Help: "Changefeeds by desired state at the coordinator's last round (0 on other nodes)"}, []string{"state"}),
		unplaced: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "cdcflow", Subsystem: "cluster", Name: "unplaced_changefeeds",
			Help: "Changefeeds to run that no node may take, at the coordinator's last round"}),
		assigned: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "cdcflow", Subsystem: "cluster", Name: "assigned_changefeeds",
			Help: "Changefeeds assigned to each node at the coordinator's last round"}, []string{"node"}),
		moves: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "cdcflow", Subsystem: "cluster", Name: "assignments_total",
			Help: "Assignments this node decided as coordinator, by reason (node gone: a failover; node draining; balance; placed; paused; no live node)"},
			[]string{"reason"}),
	}
	if reg == nil {
		return cm, nil
	}
	for _, c := range []prometheus.Collector{cm.coordinator, cm.nodes, cm.changefeeds, cm.unplaced, cm.assigned, cm.moves} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return cm, nil
}

// observe records a round's view, as its decisions leave it (the
// assignments each counts once written: Coordinator.round).
func (cm *coordinatorMetrics) observe(in PlaceInput, decisions []Decision) {
	cm.nodes.Set(float64(len(in.Nodes)))
	at := map[string]string{}
	states := map[string]float64{StateRunning: 0, StatePaused: 0}
	for _, cf := range in.Changefeeds {
		at[cf.Name] = cf.Node
		if cf.Running {
			states[StateRunning]++
		} else {
			states[StatePaused]++
		}
	}
	for s, n := range states {
		cm.changefeeds.WithLabelValues(s).Set(n)
	}
	for _, d := range decisions {
		at[d.Changefeed] = d.To
	}
	per := map[string]float64{}
	for _, n := range in.Nodes {
		per[n.ID] = 0
	}
	unplaced := 0.0
	for _, cf := range in.Changefeeds {
		switch node := at[cf.Name]; {
		case node != "":
			per[node]++
		case cf.Running:
			unplaced++
		}
	}
	cm.assigned.Reset() // nodes gone leave no series
	for n, k := range per {
		cm.assigned.WithLabelValues(n).Set(k)
	}
	cm.unplaced.Set(unplaced)
}

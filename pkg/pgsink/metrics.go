package pgsink

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdcflow/eventservice/internal/promutil"
)

type metrics struct {
	reg           prometheus.Registerer
	rows          prometheus.Counter
	commits       prometheus.Counter
	ddls          prometheus.Counter
	reconnects    prometheus.Counter
	warmed        prometheus.Counter
	warmFailures  prometheus.Counter
	stopped       prometheus.Gauge
	commitSeconds prometheus.Histogram
	connected     prometheus.GaugeFunc
}

func newMetrics(s *Sink, reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{reg: reg,
		rows: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "cdcflow", Subsystem: "pgsink", Name: "rows_total",
			Help: "Row effects written to the target (after collapsing several changes of a key in one transaction)."}),
		commits: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "cdcflow", Subsystem: "pgsink", Name: "commits_total",
			Help: "Transactions committed on the target (rows and checkpoints of many tables each)."}),
		ddls: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "cdcflow", Subsystem: "pgsink", Name: "ddls_total",
			Help: "Relation DDLs applied (new columns added)."}),
		reconnects: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "cdcflow", Subsystem: "pgsink", Name: "reconnects_total",
			Help: "Times a lane lost the target and connected again (its work kept and retried)."}),
		warmed: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "cdcflow", Subsystem: "pgsink", Name: "warmed_tables_total",
			Help: "Tables whose upsert a lane prepared and had the target plan, without running it, before their first rows (the target's caches warmed while the stream has sent nothing yet)."}),
		warmFailures: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "cdcflow", Subsystem: "pgsink", Name: "warm_failures_total",
			Help: "Warm-up pipelines the target refused (a table locked by another session past the warm-up's lock timeout, for one): the lane stops warming, and its tables' statements are prepared by their first rows' commits."}),
		stopped: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "cdcflow", Subsystem: "pgsink", Name: "stopped_tables",
			Help: "Tables stopped by a schema change the sink cannot apply, or changes the target kept refusing."}),
		commitSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "cdcflow", Subsystem: "pgsink", Name: "commit_duration_seconds",
			Help: "Time to apply and commit one lane transaction.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		connected: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "cdcflow", Subsystem: "pgsink", Name: "connected",
			Help: "1 while every lane's connection to the target works, 0 otherwise."}, func() float64 {
			if s.Connected() {
				return 1
			}
			return 0
		}),
	}
	if err := promutil.RegisterAll(reg, m.all()...); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *metrics) all() []prometheus.Collector {
	return []prometheus.Collector{m.rows, m.commits, m.ddls, m.reconnects, m.warmed, m.warmFailures, m.stopped, m.commitSeconds, m.connected}
}

func (m *metrics) unregister() { promutil.UnregisterAll(m.reg, m.all()...) }

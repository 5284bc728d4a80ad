package pgsource

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdcflow/eventservice/internal/promutil"
)

// metrics are a Source's.
type metrics struct {
	reg           prometheus.Registerer
	commits       prometheus.Counter
	rows          prometheus.Counter
	ddls          prometheus.Counter
	heartbeats    prometheus.Counter
	replays       prometheus.Counter
	reconnects    prometheus.Counter
	silences      prometheus.Counter
	skippedTables prometheus.Counter
	refused       prometheus.Counter
	committedTs   prometheus.Gauge
	confirmedLSN  prometheus.Gauge
	walEnd        prometheus.Gauge
	snapshotRows  prometheus.Counter
	snapshotDone  prometheus.Gauge
	copyRows      prometheus.Counter
	copyRetries   prometheus.Counter
	joined        prometheus.Counter
	connected     prometheus.GaugeFunc
	behind        prometheus.GaugeFunc
	slot          *slotCollector
}

func newMetrics(s *Source, reg prometheus.Registerer) (*metrics, error) {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "cdcflow", Subsystem: "pgsource", Name: name, Help: help})
	}
	g := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "cdcflow", Subsystem: "pgsource", Name: name, Help: help})
	}
	m := &metrics{reg: reg,
		commits:       c("commits_total", "Transactions decoded from the replication stream (reads of a replay included)."),
		rows:          c("rows_total", "Row changes decoded for subscribed tables."),
		ddls:          c("ddls_total", "New relation versions recorded as DDLs."),
		heartbeats:    c("heartbeats_total", "Heartbeat messages decoded (written when the database was idle)."),
		replays:       c("replays_total", "Times the stream started again from the slot for a subscription from a past start-ts."),
		reconnects:    c("reconnects_total", "Times the replication connection was opened again after an error."),
		silences:      c("receive_timeouts_total", "Replication sessions ended because the server sent nothing within the receive timeout (a reply asked for half-way included)."),
		skippedTables: c("skipped_tables_total", "Published tables whose changes are skipped: they have no key."),
		refused: c("refused_pushes_total", "Pushes the store refused (rows at or below their table's resolved-ts, or a resolved-ts "+
			"below the last): the stream and the store disagree on what was delivered, and those rows may be missing downstream. Never expected; alert on any."),
		committedTs:  g("committed_ts_seconds", "Physical time of the last commit's commit-ts (Unix seconds)."),
		confirmedLSN: g("confirmed_flush_lsn", "The LSN last confirmed to the slot: the WAL it retains starts here."),
		walEnd:       g("server_wal_end_lsn", "The server's WAL end, from its keepalives (at least confirmed_flush_lsn: their difference is never negative)."),
		snapshotRows: c("snapshot_rows_total", "Rows copied by the initial snapshot."),
		snapshotDone: g("snapshot_tables_done", "Tables the initial snapshot has copied."),
		copyRows:     c("copy_rows_total", "Rows of tables that joined while running copied into the stream (CopyTable)."),
		copyRetries: c("copy_retries_total", "Chunks of a copy read again: a truncate or a new relation version in the chunk's window, "+
			"a commit the chunk's snapshot could not see yet (waiting for a synchronous standby), or no subscription yet."),
		joined: c("joined_tables_total", "Published tables that joined while running (announced through OnNewTable)."),
		connected: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "cdcflow", Subsystem: "pgsource", Name: "connected",
			Help: "1 while a replication session streams from the source, 0 otherwise."}, func() float64 {
			if s.streaming.Load() {
				return 1
			}
			return 0
		}),
		behind: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "cdcflow", Subsystem: "pgsource", Name: "behind_bytes",
			Help: "The server's WAL end (its keepalives) minus the position last confirmed to the slot; never negative."}, func() float64 {
			end, conf := s.walEnd.Load(), s.confirmed.Load()
			if end < conf {
				return 0
			}
			return float64(end - conf)
		}),
		slot: newSlotCollector(s),
	}
	if err := promutil.RegisterAll(reg, m.all()...); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *metrics) all() []prometheus.Collector {
	return []prometheus.Collector{m.commits, m.rows, m.ddls, m.heartbeats, m.replays, m.reconnects, m.silences, m.skippedTables, m.refused,
		m.committedTs, m.confirmedLSN, m.walEnd, m.snapshotRows, m.snapshotDone,
		m.copyRows, m.copyRetries, m.joined, m.connected, m.behind, m.slot}
}

func (m *metrics) unregister() { promutil.UnregisterAll(m.reg, m.all()...) }

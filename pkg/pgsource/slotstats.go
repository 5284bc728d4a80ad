package pgsource

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// The slot's statistics, read-only: what the server says of the WAL the
// slot holds it to (retained, unconfirmed, wal_status, safe_wal_size),
// exported as metrics and read by an embedder that bounds it (serve's
// --max-retained-wal). Invariants: a slot the server invalidated (wal_status
// lost) stops the source with ErrSlotLost, at start and while streaming; a
// slot that vanished while streaming with ErrSlotDropped; neither is taken
// for a protocol violation.

// isSlotMissing reports whether err is the server saying the slot does
// not exist (START_REPLICATION of a dropped slot).
func isSlotMissing(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "42704" && strings.Contains(pe.Message, "replication slot")
}

// SlotStats is what the server says of the slot (pg_replication_slots):
// how much WAL it holds the server to, and how close that is to the
// server's bound.
type SlotStats struct {
	// Exists: the slot was found.
	Exists bool
	// ActivePID is the walsender streaming it (0: none).
	ActivePID int32
	// RetainedBytes is the WAL the server keeps for it: the current WAL
	// position minus its restart_lsn.
	RetainedBytes int64
	// UnconfirmedBytes is the WAL past what it confirmed: the current WAL
	// position minus its confirmed_flush_lsn.
	UnconfirmedBytes int64
	// WALStatus is the server's: reserved, extended, unreserved or lost.
	WALStatus string
	// SafeWALSize is how much more WAL can be written before the slot is
	// at risk of being invalidated (SafeWALSizeKnown false: the server
	// sets no bound, max_slot_wal_keep_size = -1).
	SafeWALSize      int64
	SafeWALSizeKnown bool
	// At is when it was read (zero: never).
	At time.Time
}

// ReadSlotStats reads the slot's statistics through conn (a connection to
// the source; a control connection runs it too).
func ReadSlotStats(ctx context.Context, conn *pgx.Conn, slot string) (SlotStats, error) {
	var st SlotStats
	var pid *int32
	var retained, unconfirmed, safe *int64
	var status *string
	err := conn.QueryRow(ctx, `SELECT active_pid, (pg_current_wal_lsn() - restart_lsn)::bigint,
  (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint, wal_status, safe_wal_size
FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&pid, &retained, &unconfirmed, &status, &safe)
	if errors.Is(err, pgx.ErrNoRows) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("pgsource: read the slot's statistics: %w", err)
	}
	st.Exists = true
	if pid != nil {
		st.ActivePID = *pid
	}
	if retained != nil {
		st.RetainedBytes = max(*retained, 0)
	}
	if unconfirmed != nil {
		st.UnconfirmedBytes = max(*unconfirmed, 0)
	}
	if status != nil {
		st.WALStatus = *status
	}
	if safe != nil {
		st.SafeWALSize, st.SafeWALSizeKnown = *safe, true
	}
	return st, nil
}

// isSlotLost reports whether err is the server refusing to stream an
// invalidated slot (PostgreSQL 15: "cannot read from logical replication
// slot", detail "invalidated").
func isSlotLost(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "55000" &&
		(strings.Contains(pe.Detail, "invalidated") || strings.Contains(pe.Message, "can no longer get changes"))
}

// slotLostError is ErrSlotLost with what to do about it.
func slotLostError(slot string) error {
	return fmt.Errorf("%w: slot %s retained more WAL than max_slot_wal_keep_size allows; the changefeed cannot resume. "+
		"To start over with a new snapshot (the target's tables are emptied and copied again), drop the slot on the source "+
		"(SELECT pg_drop_replication_slot('%s')) and start serve", ErrSlotLost, slot, slot)
}

// SlotStats returns the slot's statistics as last read (every
// SlotStatsInterval, on the side connection).
func (s *Source) SlotStats() SlotStats {
	s.slot.mu.Lock()
	defer s.slot.mu.Unlock()
	return s.slot.last
}

// runSlotStats reads the slot's statistics at once, then every
// SlotStatsInterval.
func (s *Source) runSlotStats() {
	read := func(ctx context.Context, conn *pgx.Conn) error {
		st, err := ReadSlotStats(ctx, conn, s.opts.Slot)
		if err != nil {
			return err
		}
		st.At = s.now()
		s.slot.mu.Lock()
		s.slot.last = st
		s.slot.mu.Unlock()
		if st.WALStatus == "lost" {
			s.stop(slotLostError(s.opts.Slot))
		}
		return nil
	}
	s.side.run(s, "slot statistics", zap.WarnLevel, 30*time.Second, read)
	s.everyTick(s.opts.SlotStatsInterval, 30*time.Second, "slot statistics", zap.WarnLevel, read)
}

// slotState holds the last SlotStats.
type slotState struct {
	mu   sync.Mutex
	last SlotStats
}

// slotCollector exports the last SlotStats: a safe WAL size only where
// the server has a bound, and wal_status as one series per status.
type slotCollector struct {
	s                                   *Source
	retained, unconfirmed, safe, status *prometheus.Desc
}

var walStatuses = []string{"reserved", "extended", "unreserved", "lost"}

func newSlotCollector(s *Source) *slotCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName("cdcflow", "pgsource", name), help, labels, nil)
	}
	return &slotCollector{s: s,
		retained:    d("slot_retained_bytes", "WAL the server keeps for the slot: the current WAL position minus its restart_lsn (read every 10 s)."),
		unconfirmed: d("slot_unconfirmed_bytes", "WAL past what the slot confirmed: the current WAL position minus its confirmed_flush_lsn."),
		safe:        d("slot_safe_wal_size_bytes", "WAL that can still be written before the server may invalidate the slot (absent: max_slot_wal_keep_size is unlimited)."),
		status:      d("slot_wal_status", "The slot's wal_status: 1 for the current one (reserved, extended, unreserved, lost).", "status"),
	}
}

func (c *slotCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.retained
	ch <- c.unconfirmed
	ch <- c.safe
	ch <- c.status
}

func (c *slotCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.s.SlotStats()
	if st.At.IsZero() || !st.Exists {
		return // nothing read yet: no figure rather than a false zero
	}
	ch <- prometheus.MustNewConstMetric(c.retained, prometheus.GaugeValue, float64(st.RetainedBytes))
	ch <- prometheus.MustNewConstMetric(c.unconfirmed, prometheus.GaugeValue, float64(st.UnconfirmedBytes))
	if st.SafeWALSizeKnown {
		ch <- prometheus.MustNewConstMetric(c.safe, prometheus.GaugeValue, float64(st.SafeWALSize))
	}
	for _, s := range walStatuses {
		v := 0.0
		if s == st.WALStatus {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(c.status, prometheus.GaugeValue, v, s)
	}
}

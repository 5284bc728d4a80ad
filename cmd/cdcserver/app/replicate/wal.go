package replicate

import (
	"context"
	"encoding/json"
	"time"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/pgsink"
	"github.com/cdcflow/eventservice/pkg/pgsource"
)

// The WAL a changefeed holds the source to. The slot keeps every byte of
// WAL after the lowest position every table has durably applied, and a
// stopped table's checkpoint never moves: one table stopped by a schema
// change held the whole source's WAL, without limit or warning, until its
// disk filled. Past --max-retained-wal a stopped table lets go of the
// slot: its checkpoint is dropped and a fresh copy owed, so the slot moves
// on; the changes it will never apply are what that copy replaces.

// toRelease picks the stopped tables to let go of: none while the slot
// retains at most max bytes (0: no bound) or has not been read; every
// stopped table not let go of yet otherwise (each one's checkpoint stays
// where it stopped, so each holds the slot sooner or later).
func toRelease(st pgsource.SlotStats, max int64, stopped []pgsink.StoppedTable) []pgsink.StoppedTable {
	if max <= 0 || !st.Exists || st.RetainedBytes <= max {
		return nil
	}
	var out []pgsink.StoppedTable
	for _, t := range stopped {
		if !t.Released {
			out = append(out, t)
		}
	}
	return out
}

// boundWAL releases the stopped tables toRelease picks. The fresh copy is
// owed (listed) before the checkpoint goes: a crash between the two then
// still copies the table, never resumes it from nowhere.
func (p *parts) boundWAL(ctx context.Context, cfg Config) {
	st := p.source.SlotStats()
	for _, t := range toRelease(st, cfg.MaxRetainedWAL, p.sink.StoppedTables()) {
		if err := p.copier.list(ctx, true, t.OID); err != nil {
			p.log.Warn("release a stopped table: list its copy", zap.String("table", t.Table), zap.Error(err))
			continue
		}
		if err := p.sink.Release(ctx, t.ID); err != nil {
			p.log.Warn("release a stopped table", zap.String("table", t.Table), zap.Error(err))
			continue
		}
		p.met.released.Inc()
		p.log.Error("a stopped table held the slot past --max-retained-wal: released (its checkpoint dropped; the slot moves on; "+
			"the table is copied anew at the next start)", zap.String("table", t.Table), zap.String("stopped", t.Reason),
			zap.Int64("retained_bytes", st.RetainedBytes), zap.Int64("max_retained_wal", cfg.MaxRetainedWAL))
	}
}

func stoppedKey(slot string) string { return "stopped:" + slot }

// stoppedRecord is a stopped table as the target's state keeps it, for
// status to show when serve is not running.
type stoppedRecord struct {
	OID      uint32    `json:"oid"`
	Table    string    `json:"table"`
	Reason   string    `json:"reason"`
	Since    time.Time `json:"since"`
	Released bool      `json:"released,omitempty"`
}

// recordStopped keeps the target's list of stopped tables current: written
// when it changed (the first tick writes it whatever: a list an earlier
// process left names tables this one may have bound again).
func (p *parts) recordStopped(ctx context.Context, cfg Config) {
	var recs []stoppedRecord
	for _, t := range p.sink.StoppedTables() {
		recs = append(recs, stoppedRecord{OID: t.OID, Table: t.Table, Reason: t.Reason, Since: t.Since.UTC(), Released: t.Released})
	}
	b, err := json.Marshal(recs)
	if err != nil {
		return
	}
	if p.stoppedWritten != nil && *p.stoppedWritten == string(b) {
		return
	}
	if err := p.sink.SetState(ctx, stoppedKey(cfg.Slot), string(b)); err != nil {
		return // the target down: the next tick tries again
	}
	v := string(b)
	p.stoppedWritten = &v
}

// parseStopped reads the list recordStopped wrote (hostile until read:
// what does not decode is no list).
func parseStopped(v string) ([]stoppedRecord, bool) {
	var recs []stoppedRecord
	if v == "" {
		return nil, true
	}
	if err := json.Unmarshal([]byte(v), &recs); err != nil {
		return nil, false
	}
	return recs, true
}

package pgsink

import (
	"context"
	"fmt"
	"math"

	"github.com/cdcflow/eventservice/pkg/common"
)

// Exactly once. A replay must not apply a row twice: a keyless table's
// insert is not idempotent, and a keyed table's row applied again is an
// upsert a trigger or an audit of the target sees twice (a cluster's node
// that took a changefeed over replays from the last checkpoint, which is
// the resolved-ts the sink had, often below the rows it committed). A
// lane commit may hold part of a source transaction's rows (BatchRows,
// FlushInterval), and a restart resumes from the last checkpoint before
// it. So every commit that applies a table's rows also writes, with its
// checkpoint row, the position (commit-ts, index in its transaction) of
// the last row applied (cdcflow.checkpoints.applied_ts and
// applied_index), and its checkpoint at least to that commit-ts minus one
// (every row before that commit was applied); a row (a truncate too) at
// or before the position is skipped. A transaction read again from the
// slot gives its rows the same commit-ts and indexes (pkg/pgsource), so
// the position names the same rows.

// appliedPos is the position of a table's last applied row.
type appliedPos struct {
	ts    common.Ts
	index uint32
}

// after reports whether (ts, index) comes after p.
func (p appliedPos) after(ts common.Ts, index uint32) bool {
	return ts > p.ts || ts == p.ts && index > p.index
}

// loadApplied reads the positions of bs's tables' last rows applied
// (before the stream sends them anything).
func (s *Sink) loadApplied(ctx context.Context, q querier, bs []Binding) error {
	var ids []string
	for _, b := range bs {
		ids = append(ids, hexID(b.ID))
	}
	if len(ids) == 0 {
		return nil
	}
	rows, err := q.Query(ctx, "SELECT dispatcher, applied_ts, applied_index FROM cdcflow.checkpoints WHERE dispatcher = ANY($1::text[])", ids)
	if err != nil {
		return fmt.Errorf("%w: read the positions applied: %w", ErrApply, err)
	}
	pos := map[string]appliedPos{}
	for rows.Next() {
		var id string
		var ts, index int64
		if err := rows.Scan(&id, &ts, &index); err != nil {
			rows.Close()
			return fmt.Errorf("%w: read the positions applied: %w", ErrApply, err)
		}
		if ts < 0 || index < 0 || index > math.MaxUint32 {
			rows.Close()
			return fmt.Errorf("%w: %w: dispatcher %s's position applied (%d, %d)", ErrApply, errBadData, id, ts, index)
		}
		pos[id] = appliedPos{ts: common.Ts(ts), index: uint32(index)}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("%w: read the positions applied: %w", ErrApply, err)
	}
	for _, b := range bs {
		if p, ok := pos[hexID(b.ID)]; ok {
			s.laneFor(b.Rel.OID).setApplied(b.ID, p)
		}
	}
	return nil
}

// setApplied sets dispatcher id's position applied (Bind, before any of
// its calls: the lane takes those under mu, after this).
func (l *lane) setApplied(id common.DispatcherID, p appliedPos) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if d := l.mu.states[id]; d != nil {
		d.applied, d.appliedNext = p, p
	}
}

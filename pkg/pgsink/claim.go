package pgsink

import (
	"context"
	"fmt"
	"math"
	"strings"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/common"
)

// A target table is claimed by the source table whose rows it holds
// (cdcflow.checkpoints names it per dispatcher): a table dropped and
// created again under its name, or renamed away, must not mix its rows
// into another's (ErrTargetTaken).

// targetOwner is the source table (and its dispatcher) whose checkpoint
// a target table's row in cdcflow.checkpoints records.
type targetOwner struct {
	dispatcher string
	oid        int64
}

// claimTargets finds, from cdcflow.checkpoints, the bindings of bs whose
// target table other source tables wrote, and returns those that must
// stop, with one such table each, and the target tables the changefeed
// wrote to (a checkpoint row names them, after what it emptied). A target table written only by tables
// that have left the changefeed (SetLeft says so, and their dispatchers
// are neither bound nor being bound: dropped, found at a start) and not by
// the binding's own table is emptied for it, their checkpoint rows
// deleted, in one transaction. One a table still bound wrote (dropped
// while this process runs: its dispatcher may have rows in flight) or
// that holds the binding's own rows besides is not touched: that binding
// stops.
func (s *Sink) claimTargets(ctx context.Context, conn *pgx.Conn, bs []Binding) (map[common.DispatcherID]targetOwner, map[string]bool, error) {
	names := make([]string, len(bs))
	inChangefeed := map[string]bool{}
	for i, b := range bs {
		names[i] = b.Rel.QualifiedName()
		inChangefeed[hexID(b.ID)] = true
	}
	s.mu.Lock()
	for id := range s.mu.bound {
		inChangefeed[hexID(id)] = true
	}
	s.mu.Unlock()
	rows, err := conn.Query(ctx, "SELECT target, dispatcher, table_oid FROM cdcflow.checkpoints WHERE target = ANY($1::text[])", names)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: read checkpoints: %w", ErrApply, err)
	}
	owners := map[string][]targetOwner{}
	for rows.Next() {
		var target string
		var o targetOwner
		if err := rows.Scan(&target, &o.dispatcher, &o.oid); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("%w: read checkpoints: %w", ErrApply, err)
		}
		owners[target] = append(owners[target], o)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("%w: read checkpoints: %w", ErrApply, err)
	}
	stop := map[common.DispatcherID]targetOwner{}
	written := map[string]bool{}
	for name, os := range owners {
		written[name] = len(os) > 0
	}
	var reclaim []string
	var gone []string
	for i, b := range bs {
		var own bool
		var live, left []targetOwner
		for _, o := range owners[names[i]] {
			switch {
			case o.dispatcher == hexID(b.ID):
				own = true
			case inChangefeed[o.dispatcher] || s.leftFn == nil || o.oid < 0 || o.oid > math.MaxUint32 || !s.leftFn(uint32(o.oid)):
				// An OID no table can have is not one that left: the
				// rows stay, and the binding stops.
				live = append(live, o)
			default:
				left = append(left, o)
			}
		}
		switch {
		case len(live) > 0:
			stop[b.ID] = live[0]
		case len(left) > 0 && own:
			stop[b.ID] = left[0]
		case len(left) > 0:
			reclaim = append(reclaim, names[i])
			written[names[i]] = own
			for _, o := range left {
				gone = append(gone, o.dispatcher)
				s.log.Warn("a target table held the rows of a source table that left the changefeed: emptied for the table of its name now",
					zap.String("table", names[i]), zap.Int64("old_oid", o.oid), zap.Uint32("oid", b.Rel.OID))
			}
		}
	}
	if len(reclaim) > 0 {
		if err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "TRUNCATE "+strings.Join(reclaim, ", ")); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "DELETE FROM cdcflow.checkpoints WHERE dispatcher = ANY($1::text[])", gone)
			return err
		}); err != nil {
			return nil, nil, fmt.Errorf("%w: empty the target tables of tables gone: %w", ErrApply, err)
		}
	}
	return stop, written, nil
}

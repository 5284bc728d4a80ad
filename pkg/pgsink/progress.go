package pgsink

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// The target's cdcflow.checkpoints and cdcflow.state: read, set, and cleared to start over.

// Checkpoints returns the checkpoints the target holds, by dispatcher: a
// restart resumes each dispatcher from its own.
func (s *Sink) Checkpoints(ctx context.Context) (map[common.DispatcherID]common.Ts, error) {
	conn, release, err := s.adminConn(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	rows, err := conn.Query(ctx, "SELECT dispatcher, ts FROM cdcflow.checkpoints")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[common.DispatcherID]common.Ts{}
	for rows.Next() {
		var key string
		var ts int64
		if err := rows.Scan(&key, &ts); err != nil {
			return nil, err
		}
		var id common.DispatcherID
		if _, err := fmt.Sscanf(key, "%016x%016x", &id.Hi, &id.Lo); err != nil {
			continue // not one of ours
		}
		if ts < 0 {
			// Ours, but not as the sink writes it: as a Ts it would be
			// past every commit, and the table would resume after them all.
			return nil, fmt.Errorf("%w: cdcflow.checkpoints: dispatcher %s at ts %d", ErrCorruptProgress, key, ts)
		}
		out[id] = common.Ts(ts)
	}
	return out, rows.Err()
}

// hexID is id as cdcflow.checkpoints keys it.
func hexID(id common.DispatcherID) string { return fmt.Sprintf("%016x%016x", id.Hi, id.Lo) }

// State returns the value of key in the target's cdcflow.state (ok false
// if unset): what an embedder records next to the checkpoints.
func (s *Sink) State(ctx context.Context, key string) (string, bool, error) {
	conn, release, err := s.adminConn(ctx)
	if err != nil {
		return "", false, err
	}
	defer release()
	var v string
	err = conn.QueryRow(ctx, "SELECT value FROM cdcflow.state WHERE key = $1", key).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	return v, err == nil, err
}

// SetState sets key to value in cdcflow.state.
// It is fenced: a superseded sink gets ErrSuperseded and writes nothing.
func (s *Sink) SetState(ctx context.Context, key, value string) error {
	return s.fenced(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO cdcflow.state (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value", key, value)
		return err
	})
}

// Reset empties the target tables of rels and the ones cdcflow.checkpoints
// names (those that exist, outside the cdcflow schema) and forgets every
// checkpoint and state and the owner's wrote marker, in one fenced
// transaction: a changefeed starting over from a new snapshot.
// Interrupted, it did nothing; done, it left nothing of the earlier
// changefeed. It is meant before any dispatcher is bound; the target's
// cdcflow schema holds one changefeed's checkpoints and state (one
// changefeed per target database).
func (s *Sink) Reset(ctx context.Context, rels []pgcodec.Relation) error {
	names := make([]string, len(rels))
	for i, r := range rels {
		names[i] = r.QualifiedName()
	}
	return s.fenced(ctx, func(tx pgx.Tx) error {
		// The checkpoints' targets were written by a sink (quoted as
		// pgcodec.QualifiedName quotes), but they are read back from a
		// database: a name is only compared with the relations' names
		// quoted alike, never parsed, and becomes SQL only as a relation
		// that exists, quoted by the server.
		rows, err := tx.Query(ctx, `
SELECT DISTINCT format('%I.%I', n.nspname, c.relname)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN (SELECT unnest($1::text[]) UNION SELECT target FROM cdcflow.checkpoints) AS t(name)
  ON t.name = '"' || replace(n.nspname, '"', '""') || '"."' || replace(c.relname, '"', '""') || '"'
WHERE c.relkind IN ('r', 'p') AND n.nspname <> 'cdcflow'`, names)
		if err != nil {
			return err
		}
		tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		if len(tables) > 0 {
			if _, err := tx.Exec(ctx, "TRUNCATE "+strings.Join(tables, ", ")); err != nil {
				return fmt.Errorf("%w: truncate %s: %w", ErrApply, strings.Join(tables, ", "), err)
			}
		}
		if _, err = tx.Exec(ctx, "DELETE FROM cdcflow.checkpoints; DELETE FROM cdcflow.state"); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "UPDATE cdcflow.owners SET wrote = false WHERE owner = $1", s.opts.Owner)
		return err
	}, func() { s.marked.Store(false) })
}

// ClearProgress forgets every checkpoint and state record, in one fenced
// transaction, leaving the tables as they are: a changefeed starting from
// a new snapshot on a target it never wrote to (Wrote false), whose
// records belong to an earlier slot.
func (s *Sink) ClearProgress(ctx context.Context) error {
	return s.fenced(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "DELETE FROM cdcflow.checkpoints; DELETE FROM cdcflow.state")
		return err
	})
}

package pgsink

import (
	"context"
	"fmt"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// The relation version each table was last written by, kept in the
// target (cdcflow.state, writtenKey) and changed in the transaction that
// carries a DDL (evolve.go). A restart binds a table with the version the
// current catalog gives, which may be past a DDL the stream reads again
// and the target never had (a stop between a DDL and the first row of the
// new shape): so the bind takes the kept version as the table's, and the
// stream's first description of the table in a session, always a DDL,
// carries what is missing.

func writtenKey(id common.DispatcherID) string { return "relation:" + hexID(id) }

// loadWritten reads the kept versions of bs's tables, by dispatcher (one
// that does not read, or is of another table, is no version).
func (s *Sink) loadWritten(ctx context.Context, q querier, bs []Binding) (map[common.DispatcherID]pgcodec.Relation, error) {
	keys := make([]string, len(bs))
	for i, b := range bs {
		keys[i] = writtenKey(b.ID)
	}
	rows, err := q.Query(ctx, "SELECT key, value FROM cdcflow.state WHERE key = ANY($1::text[])", keys)
	if err != nil {
		return nil, fmt.Errorf("%w: read the relation versions written: %w", ErrApply, err)
	}
	kept := map[string]string{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			rows.Close()
			return nil, fmt.Errorf("%w: read the relation versions written: %w", ErrApply, err)
		}
		kept[k] = v
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%w: read the relation versions written: %w", ErrApply, err)
	}
	out := map[common.DispatcherID]pgcodec.Relation{}
	for _, b := range bs {
		if v, ok := kept[writtenKey(b.ID)]; ok {
			if rel, err := pgcodec.ParseRelationDDL(v); err == nil && rel.OID == b.Rel.OID {
				out[b.ID] = rel
			}
		}
	}
	return out, nil
}

// saveWritten keeps rels as the versions their tables were last written
// by (at a first bind).
func (s *Sink) saveWritten(ctx context.Context, q querier, rels map[common.DispatcherID]pgcodec.Relation) error {
	if len(rels) == 0 {
		return nil
	}
	keys, values := make([]string, 0, len(rels)), make([]string, 0, len(rels))
	for id, rel := range rels {
		keys, values = append(keys, writtenKey(id)), append(values, pgcodec.RelationDDL(rel))
	}
	_, err := q.Exec(ctx, `INSERT INTO cdcflow.state (key, value) SELECT * FROM unnest($1::text[], $2::text[])
ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value`, keys, values)
	if err != nil {
		return fmt.Errorf("%w: keep the relation versions written: %w", ErrApply, err)
	}
	return nil
}

// writtenSQL keeps rel as the version dispatcher id's table is written by
// from the commit that carries it.
func writtenSQL(id common.DispatcherID, rel pgcodec.Relation) string {
	return fmt.Sprintf("INSERT INTO cdcflow.state (key, value) VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
		pgcodec.QuoteLiteral(writtenKey(id)), pgcodec.QuoteLiteral(pgcodec.RelationDDL(rel)))
}

package pgsink

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// A target table may have columns of its own: a user who creates the
// target table first can add one the source does not have (a
// `synced_at timestamptz DEFAULT now()`, a note). The sink's statements
// name their columns, so such a column keeps its default on insert and
// its value on update. What it must not do is hide a column the source
// dropped or renamed, which stops the table (evolve): the two look alike
// in the catalog. So a table's own columns are fixed when the changefeed
// first binds it, before it has written there: the target columns its
// relation lacks then are its own, recorded in cdcflow.state
// (ownColumnsKey) and taken as such at every later bind; any other
// column the relation lacks later is the source's, gone. One the sink
// could never write a row without (NOT NULL with no default) stops the
// table at once.

func ownColumnsKey(qname string) string { return "own-columns:" + qname }

// ownColumns decides the own columns of the target tables of tables,
// which exist: recorded before, for a target the changefeed wrote to
// (written), or the columns their relations lack, recorded now, for one it
// never did. It returns why a table must stop, by OID.
func (s *Sink) ownColumns(ctx context.Context, conn *pgx.Conn, tables map[uint32]*table, written map[string]bool) (map[uint32]error, error) {
	keys := make([]string, 0, len(tables))
	for _, t := range tables {
		keys = append(keys, ownColumnsKey(t.qname))
	}
	rows, err := conn.Query(ctx, "SELECT key, value FROM cdcflow.state WHERE key = ANY($1::text[])", keys)
	if err != nil {
		return nil, fmt.Errorf("%w: read own columns: %w", ErrApply, err)
	}
	recorded := map[string][]string{}
	for rows.Next() {
		var k, v string
		if err := rows.Scan(&k, &v); err != nil {
			rows.Close()
			return nil, fmt.Errorf("%w: read own columns: %w", ErrApply, err)
		}
		var cols []string
		if json.Unmarshal([]byte(v), &cols) == nil {
			recorded[k] = cols
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("%w: read own columns: %w", ErrApply, err)
	}
	stop := map[uint32]error{}
	var recKeys, recValues []string
	for oid, t := range tables {
		t.own = map[string]bool{}
		if written[t.qname] {
			for _, c := range recorded[ownColumnsKey(t.qname)] {
				t.own[c] = true
			}
			continue
		}
		var own []string
		for _, c := range t.order {
			if slices.ContainsFunc(t.rel.Columns, func(rc pgcodec.Column) bool { return rc.Name == c }) {
				continue
			}
			if t.required[c] {
				stop[oid] = fmt.Errorf("%w: %s: column %q is NOT NULL without a default, and the source has no such column: "+
					"no row could be written (give it a default, or drop its NOT NULL)", ErrSchemaChange, t.qname, c)
			}
			own = append(own, c)
			t.own[c] = true
		}
		if len(own) > 0 || len(recorded[ownColumnsKey(t.qname)]) > 0 {
			v, _ := json.Marshal(own)
			recKeys, recValues = append(recKeys, ownColumnsKey(t.qname)), append(recValues, string(v))
			if len(own) > 0 {
				s.log.Info("the target table has columns of its own: the changefeed leaves them to it",
					zap.String("table", t.qname), zap.Strings("columns", own))
			}
		}
	}
	if len(recKeys) > 0 {
		if err := s.fencedOn(ctx, conn, func(tx pgx.Tx) error {
			_, err := tx.Exec(ctx, `INSERT INTO cdcflow.state (key, value) SELECT * FROM unnest($1::text[], $2::text[])
ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value`, recKeys, recValues)
			return err
		}); err != nil {
			return nil, fmt.Errorf("%w: record own columns: %w", ErrApply, err)
		}
	}
	return stop, nil
}

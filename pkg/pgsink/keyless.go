package pgsink

import (
	"context"
	"fmt"
	"math"
	"strings"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// Tables without a key (pgcodec.Relation.Identity): their changes cannot
// collapse by key or be upserted, so they are applied one by one in
// order, as PostgreSQL's own subscriber does: an insert is a plain INSERT
// (consecutive inserts of the same columns one statement); under REPLICA
// IDENTITY FULL an update or a delete changes one row equal to the old row
// in every column, compared by the text of the target's value (every type
// has one, unlike an equality operator: json, point, xml), so of several
// equal rows one changes, which leaves the same table; a change whose old
// row the target lacks changes nothing, as natively.
//
// A replay must not apply a row twice, and an insert is not idempotent:
// a lane commit may hold part of a source transaction's rows (BatchRows,
// FlushInterval), and a restart resumes from the last checkpoint before
// it. So every commit that applies a keyless table's rows also writes,
// with its checkpoint row, the position (commit-ts, index in its
// transaction) of the last row applied (cdcflow.checkpoints.keyless_ts and
// keyless_index), and its checkpoint at least to that commit-ts minus one
// (every row before that commit was applied); a row at or before the
// position is skipped. A transaction read again from the slot gives its
// rows the same commit-ts and indexes (pkg/pgsource), so the position
// names the same rows.

// keylessPos is the position of a keyless table's last applied row.
type keylessPos struct {
	ts    common.Ts
	index uint32
}

// after reports whether (ts, index) comes after p.
func (p keylessPos) after(ts common.Ts, index uint32) bool {
	return ts > p.ts || ts == p.ts && index > p.index
}

// loadKeyless reads the positions of bs's keyless tables' last rows
// applied (before the stream sends them anything).
func (s *Sink) loadKeyless(ctx context.Context, q querier, bs []Binding) error {
	var ids []string
	for _, b := range bs {
		if b.Rel.Keyless() {
			ids = append(ids, hexID(b.ID))
		}
	}
	if len(ids) == 0 {
		return nil
	}
	rows, err := q.Query(ctx, "SELECT dispatcher, keyless_ts, keyless_index FROM cdcflow.checkpoints WHERE dispatcher = ANY($1::text[])", ids)
	if err != nil {
		return fmt.Errorf("%w: read keyless positions: %w", ErrApply, err)
	}
	pos := map[string]keylessPos{}
	for rows.Next() {
		var id string
		var ts, index int64
		if err := rows.Scan(&id, &ts, &index); err != nil {
			rows.Close()
			return fmt.Errorf("%w: read keyless positions: %w", ErrApply, err)
		}
		if ts < 0 || index < 0 || index > math.MaxUint32 {
			rows.Close()
			return fmt.Errorf("%w: %w: dispatcher %s's keyless position (%d, %d)", ErrApply, errBadData, id, ts, index)
		}
		pos[id] = keylessPos{ts: common.Ts(ts), index: uint32(index)}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("%w: read keyless positions: %w", ErrApply, err)
	}
	for _, b := range bs {
		if p, ok := pos[hexID(b.ID)]; ok && b.Rel.Keyless() {
			s.laneFor(b.Rel.OID).setKeyless(b.ID, p)
		}
	}
	return nil
}

// setKeyless sets dispatcher id's keyless position (Bind, before any of
// its calls: the lane takes those under mu, after this).
func (l *lane) setKeyless(id common.DispatcherID, p keylessPos) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if d := l.mu.states[id]; d != nil {
		d.keyless, d.keylessNext = p, p
	}
}

// keylessRows queues rows of keyless table t to q in order, skipping those
// at or before the position applied; it returns the rows written and the
// position of the last row queued (unchanged if none).
func (a *applier) keylessRows(q *pipeline, t *table, rows []common.Row, pos keylessPos) (int, keylessPos, error) {
	n := 0
	var ins insertGroup
	flush := func() {
		if ins.n > 0 {
			n += ins.queue(q, t)
			ins = insertGroup{}
		}
	}
	for i := range rows {
		r := &rows[i]
		index, err := pgcodec.ChangeIndex(r.Key)
		if err != nil {
			return 0, pos, fmt.Errorf("%w: %w: %s: %w", ErrApply, errBadData, t.qname, err)
		}
		if !pos.after(r.CommitTs, index) {
			continue // applied before a restart (see above)
		}
		pos = keylessPos{ts: r.CommitTs, index: index}
		c, err := pgcodec.DecodeValueNames(r.Value, t.order)
		if err != nil {
			return 0, pos, fmt.Errorf("%w: %w: %s: %w", ErrApply, errBadData, t.qname, err)
		}
		for _, d := range c.Columns {
			if _, ok := t.types[d.Name]; !ok {
				return 0, pos, fmt.Errorf("%w: %s: column %q is not in the target (its DDL did not come first)", ErrSchemaChange, t.qname, d.Name)
			}
		}
		switch c.Change {
		case pgcodec.Insert:
			if !ins.fits(c.Columns) {
				flush()
			}
			ins.add(c.Columns)
		case pgcodec.Truncate:
			flush()
			q.addPlain("TRUNCATE " + t.qname)
			n++
		case pgcodec.Delete, pgcodec.Update:
			flush()
			if t.rel.Identity != pgcodec.IdentityFull {
				return 0, pos, fmt.Errorf("%w: %w: %s: a %s of a table without a key or REPLICA IDENTITY FULL", ErrApply, errBadData, t.qname, c.Change)
			}
			old := c.Columns
			if c.Change == pgcodec.Update {
				old = c.From
			}
			if err := queueFindOne(q, t, c, old); err != nil {
				return 0, pos, err
			}
			n++
		default:
			return 0, pos, fmt.Errorf("%w: %w: %s: a %s of a table without a key", ErrApply, errBadData, t.qname, c.Change)
		}
	}
	flush()
	return n, pos, nil
}

// insertGroup is consecutive inserts of one set of columns: one INSERT.
type insertGroup struct {
	cols []string
	vals [][]byte // row after row, nil: NULL
	n    int
}

// fits reports whether a row of cols joins the group.
func (g *insertGroup) fits(cols []pgcodec.Datum) bool {
	if g.n == 0 {
		return true
	}
	if len(cols) != len(g.cols) {
		return false
	}
	for i, d := range cols {
		if d.Name != g.cols[i] {
			return false
		}
	}
	return true
}

func (g *insertGroup) add(cols []pgcodec.Datum) {
	if g.n == 0 {
		g.cols = make([]string, len(cols))
		for i, d := range cols {
			g.cols[i] = d.Name
		}
	}
	for _, d := range cols {
		if d.Kind == pgcodec.Null {
			g.vals = append(g.vals, nil)
		} else {
			g.vals = append(g.vals, text(d.Text))
		}
	}
	g.n++
}

// queue adds the group's INSERT to q.
func (g *insertGroup) queue(q *pipeline, t *table) int {
	if len(g.cols) == 0 {
		// A table without columns: its rows are only counted.
		st := t.statement("\x00keyless-empty", func() string {
			return fmt.Sprintf("INSERT INTO %s SELECT FROM generate_series(1, $1::bigint)", t.qname)
		})
		q.add(st, q.int64Param(int64(g.n)))
		return g.n
	}
	st := t.statement("\x00keyless-insert\x00"+strings.Join(g.cols, "\x00"), func() string { return t.insertSQL(g.cols) })
	q.addArrays(st, q.arrays(g.vals, len(g.cols))...)
	return g.n
}

// insertSQL inserts rows of cols given as text arrays, one per column.
func (t *table) insertSQL(cols []string) string {
	arrays := make([]string, len(cols))
	casts := make([]string, len(cols))
	for i, c := range cols {
		arrays[i] = fmt.Sprintf("$%d::text[]", i+1)
		casts[i] = fmt.Sprintf("u.%s::%s", pgcodec.QuoteIdent(c), t.types[c])
	}
	return fmt.Sprintf("INSERT INTO %s (%s) SELECT %s FROM unnest(%s) AS u(%s)", t.qname, quoteAll(cols),
		strings.Join(casts, ", "), strings.Join(arrays, ", "), quoteAll(cols))
}

// queueFindOne queues the delete of one row equal to old, or the update of
// one such row to c's columns (those not unchanged).
func queueFindOne(q *pipeline, t *table, c pgcodec.RowChange, old []pgcodec.Datum) error {
	var set []string
	var params [][]byte
	if c.Change == pgcodec.Update {
		for _, d := range c.Columns {
			if d.Kind == pgcodec.Unchanged {
				continue
			}
			set = append(set, d.Name)
			params = append(params, datumParam(d))
		}
	}
	match := make([]string, len(old))
	for i, d := range old {
		if d.Kind == pgcodec.Unchanged {
			return fmt.Errorf("%w: %w: %s: an old row without the value of %q", ErrApply, errBadData, t.qname, d.Name)
		}
		match[i] = d.Name
		params = append(params, datumParam(d))
	}
	if c.Change == pgcodec.Update && len(set) == 0 {
		return nil // nothing to write (a table without columns)
	}
	sig := "\x00keyless-" + c.Change.String() + "\x00" + strings.Join(set, "\x00") + "\x00\x00" + strings.Join(match, "\x00")
	st := t.statement(sig, func() string { return t.findOneSQL(set, match) })
	q.add(st, params...)
	return nil
}

// datumParam is d as a text parameter (nil: NULL).
func datumParam(d pgcodec.Datum) []byte {
	if d.Kind == pgcodec.Null {
		return nil
	}
	return text(d.Text)
}

// findOneSQL deletes (set empty) or updates set of one row whose match
// columns equal the parameters after set's, by the text of the target's
// values: (tableoid, ctid) names the row, a partition's too.
func (t *table) findOneSQL(set, match []string) string {
	p := 0
	sets := make([]string, len(set))
	for i, c := range set {
		p++
		sets[i] = fmt.Sprintf("%s = $%d::text::%s", pgcodec.QuoteIdent(c), p, t.types[c])
	}
	conds := []string{"true"}
	for _, c := range match {
		p++
		conds = append(conds, fmt.Sprintf("o.%s::text IS NOT DISTINCT FROM ($%d::text::%s)::text", pgcodec.QuoteIdent(c), p, t.types[c]))
	}
	find := fmt.Sprintf("(tableoid, ctid) = (SELECT o.tableoid, o.ctid FROM %s AS o WHERE %s LIMIT 1)", t.qname, strings.Join(conds, " AND "))
	if len(set) == 0 {
		return fmt.Sprintf("DELETE FROM %s WHERE %s", t.qname, find)
	}
	return fmt.Sprintf("UPDATE %s SET %s WHERE %s", t.qname, strings.Join(sets, ", "), find)
}

package pgsink

import (
	"fmt"
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
// keylessRows queues rows of keyless table t to q in order, skipping those
// at or before the position applied; it returns the rows written and the
// position of the last row queued (unchanged if none).
func (a *applier) keylessRows(q *pipeline, t *table, rows []common.Row, pos appliedPos) (int, appliedPos, error) {
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
		pos = appliedPos{ts: r.CommitTs, index: index}
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

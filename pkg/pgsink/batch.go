package pgsink

import (
	"fmt"
	"slices"
	"strings"
	"unsafe"

	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// batch is one table's changes of a transaction, collapsed to the last
// effect per key, in the order keys first appeared.
//
// A batch lives within one lane commit (queueWork builds it, queue hands
// its values to the pipeline that commit sends), and the rows it is
// built from stay in their dispatcher's work until that commit returned.
// So keys and values are strings over the rows' own bytes (unsafe.String),
// not copies: nothing writes into a row's bytes once it was handed to the
// sink (eventcollector.Sink's ApplyRows contract), and a copy per key and
// per value, a pointer per value and a signature string per row would be
// allocations per row on a drain's path.
type batch struct {
	m       map[string]int32 // key -> index in effects
	effects []effect         // in the order keys first appeared
}

// effect is what a batch does to one key: delete it, or upsert columns.
type effect struct {
	key  string
	del  bool
	cols []pgcodec.Datum // the key columns for a delete; every column for an upsert
}

func newBatch() *batch { return &batch{m: map[string]int32{}} }

// reset empties b for the next table's changes, letting go of the rows'
// bytes. A lane keeps one batch for all its tables, not a map and a slice
// per table and commit; one grown large (a drain's) is dropped rather than
// cleared, which would cost its whole size at every table.
func (b *batch) reset() {
	if b.m == nil || len(b.m) > 64 {
		*b = batch{m: map[string]int32{}}
		return
	}
	clear(b.m)
	clear(b.effects)
	b.effects = b.effects[:0]
}

func (b *batch) empty() bool { return len(b.effects) == 0 }

// bytesString is a string over b's bytes (see batch: they outlive it).
func bytesString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// stringBytes is s's bytes, not copied: only for reading (an encoder
// copies them into its buffer). Never nil, which would be NULL.
func stringBytes(s string) []byte {
	if s == "" {
		return emptyText
	}
	return unsafe.Slice(unsafe.StringData(s), len(s))
}

// add folds a change of key into the batch, taking ownership of
// c.Columns. An update's unchanged (TOASTed) column takes the value an
// earlier change of the batch gave it; without one it stays unchanged,
// and the upsert leaves the target's value alone.
func (b *batch) add(key []byte, c pgcodec.RowChange) {
	i, seen := b.m[bytesString(key)]
	if !seen {
		i = int32(len(b.effects))
		b.effects = append(b.effects, effect{key: bytesString(key)})
		b.m[b.effects[i].key] = i
	}
	e := &b.effects[i]
	if !seen || e.del || c.Change == pgcodec.Delete {
		e.del, e.cols = c.Change == pgcodec.Delete, c.Columns
		return
	}
	for _, d := range c.Columns {
		i := indexOf(e.cols, d.Name)
		switch {
		case i < 0:
			e.cols = append(e.cols, d)
		case d.Kind == pgcodec.Unchanged && e.cols[i].Kind != pgcodec.Unchanged:
			// keep the earlier value
		default:
			e.cols[i] = d
		}
	}
}

// fill gives cols' unchanged columns the values the batch's effect of key
// holds (an upsert of it earlier in the batch), and reports whether none
// is left unchanged.
func (b *batch) fill(key []byte, cols []pgcodec.Datum) bool {
	var e *effect
	if i, seen := b.m[bytesString(key)]; seen && !b.effects[i].del {
		e = &b.effects[i]
	}
	all := true
	for k := range cols {
		if cols[k].Kind != pgcodec.Unchanged {
			continue
		}
		if e != nil {
			if j := indexOf(e.cols, cols[k].Name); j >= 0 && e.cols[j].Kind != pgcodec.Unchanged {
				cols[k] = e.cols[j]
				continue
			}
		}
		all = false
	}
	return all
}

func indexOf(ds []pgcodec.Datum, name string) int {
	for i, d := range ds {
		if d.Name == name {
			return i
		}
	}
	return -1
}

// upsertGroup is the upserts of one set of present columns: a statement
// of its own. vals are its rows' values one row after another (nil:
// NULL), the parameters of VALUES as they are.
type upsertGroup struct {
	cols []string
	vals [][]byte
	n    int
}

// queue adds the statements that write the batch to t to p: one DELETE
// over the deleted keys, then one upsert per set of columns present (an
// update that left a TOASTed column unchanged leaves it out).
func (b *batch) queue(p *pipeline, t *table) (rows int, err error) {
	var delVals [][]byte // the deleted keys' columns, key after key
	var groups []*upsertGroup
	var present []int // e.cols indexes of the columns an upsert writes
	for k := range b.effects {
		e := &b.effects[k]
		if e.del {
			if len(t.key) == 0 {
				// A target table whose key was dropped (read again after a
				// failure): a delete cannot be applied, and must not be lost.
				return 0, fmt.Errorf("%w: %s: the target table has no primary key to delete by", ErrSchemaChange, t.qname)
			}
			for _, kc := range t.key {
				j := indexOf(e.cols, kc)
				if j < 0 || e.cols[j].Kind != pgcodec.Text {
					return 0, fmt.Errorf("%w: %w: %s: a delete without key column %q", ErrApply, errBadData, t.qname, kc)
				}
				delVals = append(delVals, text(e.cols[j].Text))
			}
			continue
		}
		present = present[:0]
		for j, d := range e.cols {
			if _, ok := t.types[d.Name]; !ok {
				return 0, fmt.Errorf("%w: %s: column %q is not in the target (its DDL did not come first)", ErrSchemaChange, t.qname, d.Name)
			}
			if d.Kind != pgcodec.Unchanged {
				present = append(present, j)
			}
		}
		g := findGroup(groups, e.cols, present)
		if g == nil {
			g = &upsertGroup{cols: make([]string, len(present))}
			for i, j := range present {
				g.cols[i] = e.cols[j].Name
			}
			groups = append(groups, g)
		}
		for _, j := range present {
			d := &e.cols[j]
			if d.Kind == pgcodec.Null {
				g.vals = append(g.vals, nil)
			} else {
				g.vals = append(g.vals, text(d.Text))
			}
		}
		g.n++
	}
	if delVals != nil {
		n := len(delVals) / len(t.key)
		if n <= valuesMaxRows {
			st := t.memo(formOf(n), true, nil, func() *stmt {
				return t.statement(deleteSig+valuesSig(n), func() string { return t.deleteValuesSQL(n) })
			})
			p.add(st, delVals...)
		} else {
			st := t.memo(formMany, true, nil, func() *stmt { return t.statement(deleteSig, t.deleteSQL) })
			p.addArrays(st, p.arrays(delVals, len(t.key))...)
		}
		rows += n
	}
	for _, g := range groups {
		if g.n <= valuesMaxRows {
			st := t.memo(formOf(g.n), false, g.cols, func() *stmt {
				return t.statement(strings.Join(g.cols, "\x00")+valuesSig(g.n), func() string { return t.upsertValuesSQL(g.cols, g.n) })
			})
			p.add(st, g.vals...)
		} else {
			st := t.memo(formMany, false, g.cols, func() *stmt {
				return t.statement(strings.Join(g.cols, "\x00"), func() string { return t.upsertSQL(g.cols) })
			})
			p.addArrays(st, p.arrays(g.vals, len(g.cols))...)
		}
		rows += g.n
	}
	return rows, nil
}

// valuesMaxRows: a statement of at most this many rows lists them as
// VALUES of text parameters instead of unnesting one text array per
// column. PostgreSQL spends more on the set-returning function than on the
// rows while there are few of them, and at 1000 tables most of a lane's
// statements carry one or two rows (docs/benchmarks.md, "Figures behind
// the code", has the crossover). Each row count is a prepared statement of
// its own, so a table of a lane has up to three upserts per set of columns
// and three deletes.
const valuesMaxRows = 2

// valuesSig tells a statement of n rows as VALUES from the unnested one in
// a table's statement cache: two NULs, which no signature holds (a name
// holds no NUL and is never empty, so its signature, the names joined by
// one NUL, never has two in a row).
func valuesSig(n int) string {
	if n == 1 {
		return "\x00\x00\x01"
	}
	return "\x00\x00\x02"
}

// arrays encodes rows of ncols values (vals, row after row) as one text
// array per column, the parameters of an unnesting statement.
func (p *pipeline) arrays(vals [][]byte, ncols int) [][]byte {
	n := len(vals) / ncols
	out := make([][]byte, ncols)
	for c := range ncols {
		out[c] = p.textArray(n, func(i int) []byte { return vals[i*ncols+c] })
	}
	return out
}

// findGroup returns the group of the columns present (cols[present[i]],
// in that order), or nil. A table's rows nearly always have one set, so
// the groups are few and a linear search is cheaper than a signature
// string per row; the same columns in another order make a group of
// their own.
func findGroup(groups []*upsertGroup, cols []pgcodec.Datum, present []int) *upsertGroup {
	for _, g := range slices.Backward(groups) {
		if len(g.cols) != len(present) {
			continue
		}
		same := true
		for i, j := range present {
			if g.cols[i] != cols[j].Name {
				same = false
				break
			}
		}
		if same {
			return g
		}
	}
	return nil
}

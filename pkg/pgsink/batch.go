package pgsink

import (
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// batch is one table's changes of a transaction, collapsed to the last
// effect per key, in the order keys first appeared.
type batch struct {
	order []string
	m     map[string]*effect
}

// effect is what a batch does to one key: delete it, or upsert columns.
type effect struct {
	del  bool
	cols []pgcodec.Datum // the key columns for a delete; every column for an upsert
}

func newBatch() *batch { return &batch{m: map[string]*effect{}} }

func (b *batch) empty() bool { return len(b.order) == 0 }

// add folds a change of key into the batch. An update's unchanged
// (TOASTed) column takes the value an earlier change of the batch gave
// it; without one it stays unchanged, and the upsert leaves the target's
// value alone.
func (b *batch) add(key string, c pgcodec.RowChange) {
	e, seen := b.m[key]
	if !seen {
		e = &effect{}
		b.m[key] = e
		b.order = append(b.order, key)
	}
	if c.Change == pgcodec.Delete {
		e.del, e.cols = true, c.Columns
		return
	}
	if !seen || e.del {
		e.del, e.cols = false, append([]pgcodec.Datum(nil), c.Columns...)
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

func indexOf(ds []pgcodec.Datum, name string) int {
	for i, d := range ds {
		if d.Name == name {
			return i
		}
	}
	return -1
}

// queue adds the statements that write the batch to t to q: one DELETE
// over the deleted keys, then one upsert per set of columns present.
func (b *batch) queue(q *pgx.Batch, t *table) (rows int, err error) {
	var delArgs [][]*string
	groups := map[string]*upsertGroup{}
	var groupOrder []string
	for _, k := range b.order {
		e := b.m[k]
		if e.del {
			if delArgs == nil {
				delArgs = make([][]*string, len(t.key))
			}
			for i, kc := range t.key {
				j := indexOf(e.cols, kc)
				if j < 0 || e.cols[j].Kind != pgcodec.Text {
					return 0, fmt.Errorf("%w: %w: %s: a delete without key column %q", ErrApply, errBadData, t.qname, kc)
				}
				delArgs[i] = append(delArgs[i], textPtr(e.cols[j].Text))
			}
			continue
		}
		var present []string
		for _, d := range e.cols {
			if _, ok := t.types[d.Name]; !ok {
				return 0, fmt.Errorf("%w: %s: column %q is not in the target (its DDL did not come first)", ErrSchemaChange, t.qname, d.Name)
			}
			if d.Kind != pgcodec.Unchanged {
				present = append(present, d.Name)
			}
		}
		sig := strings.Join(present, "\x00")
		g := groups[sig]
		if g == nil {
			g = &upsertGroup{cols: present, args: make([][]*string, len(present))}
			groups[sig] = g
			groupOrder = append(groupOrder, sig)
		}
		for i, name := range present {
			d := e.cols[indexOf(e.cols, name)]
			if d.Kind == pgcodec.Null {
				g.args[i] = append(g.args[i], nil)
			} else {
				g.args[i] = append(g.args[i], textPtr(d.Text))
			}
		}
		g.n++
	}
	if delArgs != nil {
		q.Queue(t.statement(deleteSig, t.deleteSQL), anyArgs(delArgs)...)
		rows += len(delArgs[0])
	}
	for _, sig := range groupOrder {
		g := groups[sig]
		q.Queue(t.statement(sig, func() string { return t.upsertSQL(g.cols) }), anyArgs(g.args)...)
		rows += g.n
	}
	return rows, nil
}

type upsertGroup struct {
	cols []string
	args [][]*string
	n    int
}

func textPtr(b []byte) *string {
	s := string(b)
	return &s
}

func anyArgs(cols [][]*string) []any {
	out := make([]any, len(cols))
	for i, c := range cols {
		out[i] = c
	}
	return out
}

package pgsource

import (
	"bytes"
	"fmt"
	"slices"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// The WAL core's rows (see core.go): an insert, update or delete turned
// into rows of the open transaction, spilled to the store in chunks.
// Invariants: a row carries its transaction's commit-ts; an update that
// changes the key is a delete and an insert (or one move, when it leaves a
// TOASTed value unchanged); a table's rows are pushed in the order decoded,
// spilled in chunks while the transaction is open and the rest at its
// commit, whose push carries the commit-ts as the resolved-ts; a
// subscription that already has the commit is not pushed it again.

// change turns an insert, update or delete into rows of the transaction:
// an update that changes the key is a delete of the old key and an insert,
// or a move when it leaves a TOASTed value unchanged.
func (c *core) change(oid uint32, kind pgcodec.Change, old []tupleCol, oldKind byte, new []tupleCol) error {
	if c.cur == nil {
		return fmt.Errorf("%w: a change outside a transaction", ErrProtocol)
	}
	m := c.rels[oid]
	if m == nil {
		return fmt.Errorf("%w: a change of relation %d before its description", ErrProtocol, oid)
	}
	rel := c.st.known[oid]
	for _, t := range [][]tupleCol{old, new} {
		if t != nil && len(t) != len(m.columns) {
			return fmt.Errorf("%w: a tuple of %d columns for %s.%s of %d", ErrProtocol, len(t), m.namespace, m.name, len(m.columns))
		}
		if t != nil && len(t) != len(rel.Columns) {
			// The relation version in use (a snapshot copy's, adopted
			// from the catalog) is not the stream's description: the
			// tuple cannot be read by it, and indexing it would panic.
			return fmt.Errorf("%w: a tuple of %d columns for %s.%s, whose relation version in use has %d", ErrProtocol,
				len(t), m.namespace, m.name, len(rel.Columns))
		}
	}
	// The key and the datums are built in the core's scratch slices: add
	// encodes them into the row (pgcodec.EncodeRow copies), so one
	// allocation per row is all a change costs here. They alias the
	// message, so they are cleared on the way out: an idle session would
	// otherwise pin its last message's buffer (a large TOASTed value).
	defer c.clearScratch()
	keyOf := func(t []tupleCol, into [][]byte) ([][]byte, bool) {
		k := into[:0]
		for i, col := range rel.Columns {
			if col.Key {
				if t[i].kind != 't' && t[i].kind != 'b' {
					return nil, false
				}
				k = append(k, t[i].data)
			}
		}
		return k, true
	}
	datums := func(t []tupleCol, keysOnly bool, fill []tupleCol) []pgcodec.Datum {
		out := c.datums[:0]
		for i, col := range rel.Columns {
			if keysOnly && !col.Key {
				continue
			}
			v := t[i]
			if v.kind == 'u' && fill != nil && fill[i].kind == 't' {
				v = fill[i] // REPLICA IDENTITY FULL: the old tuple has the value
			}
			d := pgcodec.Datum{Name: col.Name}
			switch v.kind {
			case 'n':
				d.Kind = pgcodec.Null
			case 'u':
				d.Kind = pgcodec.Unchanged
			default:
				d.Kind, d.Text = pgcodec.Text, v.data
			}
			out = append(out, d)
		}
		c.datums = out
		return out
	}
	if rel.Keyless() && kind != pgcodec.Insert {
		return c.keylessChange(oid, rel, kind, old, oldKind, new, datums)
	}
	switch kind {
	case pgcodec.Insert:
		key, ok := keyOf(new, c.keys[0])
		if !ok {
			return fmt.Errorf("%w: %s without a key value", ErrProtocol, rel.QualifiedName())
		}
		c.keys[0] = key
		c.add(oid, kind, key, pgcodec.RowChange{Change: kind, Columns: datums(new, false, nil)})
		return nil
	case pgcodec.Update:
		newKey, ok := keyOf(new, c.keys[0])
		var fill []tupleCol
		if oldKind == 'O' {
			fill = old
		}
		if !ok && old != nil {
			newKey, ok = keyOf(old, c.keys[0]) // a key column left unchanged (TOASTed)
		}
		if !ok {
			return fmt.Errorf("%w: an update of %s without a key value", ErrProtocol, rel.QualifiedName())
		}
		c.keys[0] = newKey
		if old != nil {
			if oldKey, ok := keyOf(old, c.keys[1]); ok && !sameKey(oldKey, newKey) {
				c.keys[1] = oldKey
				if cols := datums(new, false, fill); hasUnchanged(cols) {
					// The unchanged value is in the old row only: a move,
					// not a delete and an insert (which would write NULL).
					from := make([]pgcodec.Datum, 0, len(newKey))
					for i, col := range rel.Columns {
						if col.Key {
							from = append(from, pgcodec.Datum{Name: col.Name, Kind: pgcodec.Text, Text: old[i].data})
						}
					}
					c.add(oid, pgcodec.Move, newKey, pgcodec.RowChange{Change: pgcodec.Move, Columns: cols, From: from})
					return nil
				}
				c.add(oid, pgcodec.Delete, oldKey, pgcodec.RowChange{Change: pgcodec.Delete, Columns: datums(old, true, nil)})
				kind = pgcodec.Insert // the new key's row did not exist
			}
		}
		c.add(oid, kind, newKey, pgcodec.RowChange{Change: kind, Columns: datums(new, false, fill)})
		return nil
	default: // delete
		key, ok := keyOf(old, c.keys[0])
		if !ok {
			return fmt.Errorf("%w: a delete of %s without a key value", ErrProtocol, rel.QualifiedName())
		}
		c.keys[0] = key
		c.add(oid, kind, key, pgcodec.RowChange{Change: kind, Columns: datums(old, true, nil)})
		return nil
	}
}

// keylessChange adds an update or a delete of a table without a key: under
// REPLICA IDENTITY FULL, pgoutput's old tuple holds every column (TOASTed
// values flattened), by which the sink finds the row; an update's
// unchanged values are the old row's. A table of another identity has no
// old tuple: PostgreSQL refuses its updates and deletes once they are
// published, so one arriving is the server's protocol broken.
func (c *core) keylessChange(oid uint32, rel pgcodec.Relation, kind pgcodec.Change, old []tupleCol, oldKind byte,
	new []tupleCol, datums func([]tupleCol, bool, []tupleCol) []pgcodec.Datum) error {
	if rel.Identity != pgcodec.IdentityFull || old == nil || oldKind != 'O' {
		return fmt.Errorf("%w: %s of %s (no key, identity %s) without its old row", ErrProtocol, kind, rel.QualifiedName(), rel.Identity)
	}
	for _, v := range old {
		if v.kind == 'u' {
			return fmt.Errorf("%w: %s of %s with an old row missing a value", ErrProtocol, kind, rel.QualifiedName())
		}
	}
	if kind == pgcodec.Delete {
		c.add(oid, kind, nil, pgcodec.RowChange{Change: kind, Columns: datums(old, false, nil)})
		return nil
	}
	from := slices.Clone(datums(old, false, nil)) // datums reuses its slice
	c.add(oid, kind, nil, pgcodec.RowChange{Change: kind, Columns: datums(new, false, old), From: from})
	return nil
}

// hasUnchanged reports whether a column of cols is an unchanged TOASTed
// value.
func hasUnchanged(cols []pgcodec.Datum) bool {
	for _, d := range cols {
		if d.Kind == pgcodec.Unchanged {
			return true
		}
	}
	return false
}

// clearScratch drops change's references into the last message.
func (c *core) clearScratch() {
	clear(c.datums)
	clear(c.keys[0])
	clear(c.keys[1])
}

func sameKey(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
}

// add appends a row to the transaction, spilling the table's rows to the
// store once it holds chunkRows of them. A change of a published table
// nobody subscribed is announced once (the slot is held before it).
func (c *core) add(oid uint32, kind pgcodec.Change, key [][]byte, change pgcodec.RowChange) {
	t := c.cur
	t.index++
	if len(c.st.copyTables) > 0 || len(c.st.copyWindows) > 0 {
		if w := c.keylessWindow(oid); w != nil {
			// Held until the chunk's high watermark (copy_keyless.go).
			w.truncated = w.truncated || kind == pgcodec.Truncate
			_, v := pgcodec.EncodeRow(t.index, key, change)
			c.hold(w, pgcodec.Op(kind), v)
			return
		}
		c.noteCopies(oid, kind, key, &change)
	}
	if len(c.subs[oid]) == 0 {
		c.unsubscribed(oid, t.ts)
		return
	}
	k, v := pgcodec.EncodeRow(t.index, key, change)
	c.pushRow(oid, pgcodec.Op(kind), k, v)
}

// addRow appends an encoded change (a keyless chunk's held one) to the
// transaction, under a key of its own index there.
func (c *core) addRow(oid uint32, op common.OpType, key [][]byte, value []byte) {
	t := c.cur
	t.index++
	if len(c.subs[oid]) == 0 {
		return
	}
	c.pushRow(oid, op, pgcodec.AppendKey(nil, t.index, key), value)
}

// pushRow appends a row to the transaction's pending rows of oid,
// spilling them once there are chunkRows, or chunkBytes of them.
func (c *core) pushRow(oid uint32, op common.OpType, k, v []byte) {
	t := c.cur
	row := common.Row{Op: op, Key: k, Value: v, StartTs: t.ts - 1, CommitTs: t.ts}
	t.pending[oid] = append(t.pending[oid], row)
	if t.pendingBytes == nil {
		t.pendingBytes = map[uint32]int{}
	}
	t.pendingBytes[oid] += row.Size()
	c.tally.rows++
	if len(t.pending[oid]) >= c.chunkRows || t.pendingBytes[oid] >= c.chunkBytes {
		c.flush(oid, false)
	}
}

// unsubscribed handles a change of a table without a subscription.
func (c *core) unsubscribed(oid uint32, ts common.Ts) {
	if c.announced[oid] {
		return
	}
	c.announced[oid] = true
	rel, ok := c.st.known[oid]
	if ok && rel.Schema == ToolSchema {
		return // the tool's own state (a FOR ALL TABLES publication includes it): never replicated
	}
	relErr := rel.Validate()
	if !ok {
		rel.OID, relErr = oid, fmt.Errorf("%w: no description of relation %d", ErrUnreplicable, oid)
	}
	c.emit(action{kind: actAnnounce, rel: rel, err: relErr, ts: ts})
}

// flush pushes the transaction's pending rows of oid to its subscriptions
// that have not had this commit yet; last marks the commit, and its push
// carries the commit-ts as the subscription's resolved-ts (see commit).
func (c *core) flush(oid uint32, last bool) {
	t := c.cur
	rows := t.pending[oid]
	delete(t.pending, oid)
	delete(t.pendingBytes, oid)
	for _, b := range c.subs[oid] {
		if b.missed {
			continue // it waits for the replay (see)
		}
		if t.ts <= b.have && b.partial != t.ts {
			continue // pushed before this session started again
		}
		if last && (len(rows) > 0 || b.partial == t.ts) {
			b.noteUnapplied(t.ts) // rows of this commit went to it (Lag)
		}
		batch := eventstore.Batch{Rows: rows}
		if last && t.ts > b.resolved {
			batch.ResolvedTs = t.ts
		}
		if len(rows) > 0 || batch.ResolvedTs != 0 {
			if b.partial != t.ts && !last {
				b.partial = t.ts
				t.spilled = append(t.spilled, b)
			}
			c.emit(action{kind: actPush, sub: b, batch: batch})
		}
		if last {
			b.have, b.partial = t.ts, 0
			if batch.ResolvedTs != 0 {
				b.resolved = batch.ResolvedTs
			}
		}
	}
}

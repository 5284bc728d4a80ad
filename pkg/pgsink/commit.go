package pgsink

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// A lane's transaction: the statements one commit sends (the fence, each
// dispatcher's collapsed rows and DDL, the checkpoints), as one pipeline
// (the applier's, applier.go).

// durableMark is a checkpoint a commit made durable, reported to the
// collector under its epoch.
// ckptRow is a checkpoint row a commit writes: its dispatcher and ts.
type ckptRow struct {
	d  *dstate
	ts common.Ts
}

type durableMark struct {
	id    common.DispatcherID
	epoch uint64
	ts    common.Ts
}

// checkpointSQL upserts the checkpoints of a commit, given as arrays,
// with the position of each table's last row applied (applied.go).
const checkpointSQL = `
INSERT INTO cdcflow.checkpoints (dispatcher, table_oid, target, ts, applied_ts, applied_index)
SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[])
ON CONFLICT (dispatcher) DO UPDATE SET ts = GREATEST(cdcflow.checkpoints.ts, EXCLUDED.ts), table_oid = EXCLUDED.table_oid,
  target = EXCLUDED.target, updated_at = now(),
  applied_ts = EXCLUDED.applied_ts, applied_index = EXCLUDED.applied_index`

// commit applies ds's work and checkpoints in one transaction: every
// statement goes in one pipeline, run in one implicit transaction (one
// round trip, all or nothing), however many tables the lane holds. Once
// it committed it returns the checkpoints it made durable and the rows it
// wrote; the caller records and reports them.
func (a *applier) commit(ds []*dstate) (marks []durableMark, applied int, err error) {
	ctx := a.s.ctx
	p := &a.pipe
	p.stmts, p.buf = p.stmts[:0], p.buf[:0]
	defer p.release()
	p.add(&a.fence, a.owner, p.int64Param(a.s.generation)) // first: see fence.go
	mark := false
	if !a.s.marked.Load() {
		for _, d := range ds {
			if mark = d.rows; mark {
				p.add(&a.markWrote, a.owner) // once per owner, not per commit
				break
			}
		}
	}
	ckd := a.ckd[:0] // the checkpoint rows' dispatchers and ts
	defer func() { clear(ckd); a.ckd = ckd[:0] }()
	// The tables as they were: a DDL of the work changes them
	// (evolved), and a transaction that fails did not.
	states := a.states[:0]
	for _, d := range ds {
		states = append(states, d.table.state())
	}
	defer func() { clear(states); a.states = states[:0] }()
	undo := func() {
		for i, d := range ds {
			d.table.restore(states[i])
		}
	}
	for _, d := range ds {
		d.appliedNext, d.droppedNext = d.applied, d.dropped // what a failed commit queued is not applied
		n, ckpt, err := a.queueWork(p, d)
		if err != nil {
			undo()
			return nil, 0, err
		}
		applied += n
		if ckpt != 0 {
			marks = append(marks, durableMark{id: d.id, epoch: d.epoch, ts: ckpt})
		}
		row := ckpt
		if d.appliedNext != d.applied {
			// Every row before the last one's commit was applied: the
			// checkpoint is at least there (applied.go).
			row = max(row, d.appliedNext.ts-1)
		}
		if row != 0 && !d.dropped && !d.droppedNext { // a dropped table's row went with it
			ckd = append(ckd, ckptRow{d: d, ts: row})
		}
	}
	if len(ckd) > 0 {
		p.addArrays(&a.checkpoints,
			p.textArray(len(ckd), func(i int) []byte { return stringBytes(ckd[i].d.hexID) }),
			p.int8Array(len(ckd), func(i int) int64 { return int64(ckd[i].d.table.rel.OID) }),
			p.textArray(len(ckd), func(i int) []byte { return stringBytes(ckd[i].d.table.qname) }),
			p.int8Array(len(ckd), func(i int) int64 { return int64(ckd[i].ts) }),
			p.int8Array(len(ckd), func(i int) int64 { return int64(ckd[i].d.appliedNext.ts) }),
			p.int8Array(len(ckd), func(i int) int64 { return int64(ckd[i].d.appliedNext.index) }))
	}
	if err := a.s.permit(); err != nil {
		undo()
		return nil, 0, err
	}
	if err := a.send(ctx, p); err != nil {
		undo()
		a.reloadTables(ds) // what the target holds now, in case it changed meanwhile
		return nil, 0, fmt.Errorf("%w: %w", ErrApply, err)
	}
	for _, d := range ds {
		d.applied, d.dropped = d.appliedNext, d.droppedNext
	}
	if mark {
		a.s.marked.Store(true)
	}
	return marks, applied, nil
}

// send runs p in one transaction. A pipeline without DDL goes as one
// (an implicit transaction); one with an ADD COLUMN runs its statements
// one by one in an explicit transaction, because a pipeline prepares
// every statement before running any, and the rows' upsert names a column
// the ALTER before it has not added yet.
func (a *applier) send(ctx context.Context, p *pipeline) error {
	if p.hasDDL() {
		return a.runInTransaction(ctx, p)
	}
	return a.exec(ctx, p)
}

// reloadTables reads ds's tables from the target again after a failed
// transaction, whose ADD COLUMNs rolled back with it.
func (a *applier) reloadTables(ds []*dstate) {
	rels := make([]pgcodec.Relation, 0, len(ds))
	for _, d := range ds {
		rels = append(rels, d.table.rel)
	}
	conn, release, err := a.s.adminConn(a.s.ctx)
	if err != nil {
		return
	}
	defer release()
	fresh, err := loadTables(a.s.ctx, conn, rels)
	if err != nil {
		return
	}
	for _, d := range ds {
		t := fresh[d.table.rel.OID]
		if t == nil || len(t.order) == 0 {
			continue
		}
		if maps.Equal(t.types, d.table.types) && slices.Equal(t.order, d.table.order) && slices.Equal(t.key, d.table.key) {
			continue // unchanged: its statements stand (each forgotten one stays prepared on the lane's backend)
		}
		d.table.types, d.table.order, d.table.key = t.types, t.order, t.key
		d.table.forget()
	}
}

// queueWork queues one dispatcher's work in order: rows collapse into a
// batch, queued before a DDL and replaced by a truncate; it returns the
// rows written and the last checkpoint of the work.
func (a *applier) queueWork(q *pipeline, d *dstate) (int, common.Ts, error) {
	t := d.table
	b := &a.batch
	b.reset()
	n := 0
	var ckpt common.Ts
	flush := func() error {
		if b.empty() {
			return nil
		}
		k, err := b.queue(q, t)
		n += k
		b.reset()
		return err
	}
	for _, w := range d.work {
		switch w.kind {
		case opRows:
			if t.rel.Keyless() {
				k, pos, err := a.keylessRows(q, t, w.rows, d.appliedNext)
				if err != nil {
					return 0, 0, err
				}
				n += k
				d.appliedNext = pos
				continue
			}
			for i := range w.rows {
				r := &w.rows[i]
				index, err := pgcodec.ChangeIndex(r.Key)
				if err != nil {
					return 0, 0, fmt.Errorf("%w: %w: %s: %w", ErrApply, errBadData, t.qname, err)
				}
				if !d.appliedNext.after(r.CommitTs, index) {
					continue // applied before a restart or a take-over (applied.go)
				}
				d.appliedNext = appliedPos{ts: r.CommitTs, index: index}
				c, err := pgcodec.DecodeValueNames(r.Value, t.order)
				if err != nil {
					return 0, 0, fmt.Errorf("%w: %w: %s: %w", ErrApply, errBadData, t.qname, err)
				}
				if c.Change == pgcodec.Truncate {
					b.reset() // what the transaction wrote before is gone too
					q.addPlain("TRUNCATE " + t.qname)
					continue
				}
				if len(r.Key) < 4 {
					return 0, 0, fmt.Errorf("%w: %w: %s: a %d-byte row key", ErrApply, errBadData, t.qname, len(r.Key))
				}
				if c.Change == pgcodec.Move {
					moved, err := a.queueMove(q, t, b, r.Key[4:], c, flush)
					if err != nil {
						return 0, 0, err
					}
					if moved {
						n++ // its own statement, after the batch it flushed
					}
					b.add(moveFromKey(c.From), pgcodec.RowChange{Change: pgcodec.Delete, Columns: c.From})
					continue
				}
				b.add(r.Key[4:], c)
			}
		case opDDL:
			if err := flush(); err != nil {
				return 0, 0, err
			}
			if oid, ok := pgcodec.ParseDropTableDDL(w.ddl); ok {
				if oid == t.rel.OID && !d.dropped {
					// The source table was dropped: so is its target table,
					// with what the sink kept of it, so that a table created
					// again under its name starts afresh.
					q.addPlain("DROP TABLE IF EXISTS " + t.qname)
					q.addPlain("DELETE FROM cdcflow.checkpoints WHERE dispatcher = " + pgcodec.QuoteLiteral(d.hexID))
					q.addPlain("DELETE FROM cdcflow.state WHERE key IN (" + pgcodec.QuoteLiteral(ownColumnsKey(t.qname)) + ", " +
						pgcodec.QuoteLiteral(writtenKey(d.id)) + ")")
					d.droppedNext = true
					a.s.met.ddls.Inc()
				}
				continue
			}
			if d.dropped || d.droppedNext {
				continue // a table of its OID again cannot be: nothing to change
			}
			rel, err := pgcodec.ParseRelationDDL(w.ddl)
			if err != nil {
				return 0, 0, fmt.Errorf("%w: %s: %w", ErrSchemaChange, t.qname, err)
			}
			has, err := createdTypes(a.s.ctx, a.conn, rel)
			if err != nil {
				return 0, 0, fmt.Errorf("%w: %s: read types: %w", ErrApply, t.qname, err)
			}
			stmts, err := t.evolve(rel, has)
			if err != nil {
				return 0, 0, err
			}
			if len(stmts) == 0 && pgcodec.RelationDDL(rel) == pgcodec.RelationDDL(t.rel) {
				continue // a session's first description of a table it has (pgsource's core.relation): nothing to write
			}
			for _, stmt := range stmts {
				q.addPlain(stmt)
			}
			q.addPlain(writtenSQL(d.id, rel))
			t.evolved(rel, has) // undone by commit if the transaction fails
			a.s.met.ddls.Inc()
		case opCheckpoint:
			ckpt = w.ts
		}
	}
	if err := flush(); err != nil {
		return 0, 0, err
	}
	return n, ckpt, nil
}

// queueMove applies a move (an update that changed the row's key and left
// a TOASTed column unchanged) of table t to batch b or, when b does not
// hold the unchanged values, to q: it flushes b (its changes of the old
// key included, so the old row is as the move found it) and queues one
// statement that inserts the new row with the unchanged columns copied
// from the old row in the target, or NULL if the target has no such row
// (then nothing holds the value). moved reports the second: the move is
// a statement of its own (flush started a new batch). Either way the
// caller then deletes the old key in the batch, after the move.
func (a *applier) queueMove(q *pipeline, t *table, b *batch, key []byte, c pgcodec.RowChange, flush func() error) (moved bool, err error) {
	if len(c.From) != len(t.key) {
		return false, fmt.Errorf("%w: %w: %s: a move from %d key columns, the table has %d", ErrApply, errBadData, t.qname, len(c.From), len(t.key))
	}
	from := moveFromKey(c.From)
	if b.fill(from, c.Columns) {
		b.add(key, pgcodec.RowChange{Change: pgcodec.Insert, Columns: c.Columns})
		return false, nil
	}
	if err := flush(); err != nil {
		return false, err
	}
	var present, unchanged []string
	var args [][]byte
	for _, d := range c.Columns {
		if _, ok := t.types[d.Name]; !ok {
			return false, fmt.Errorf("%w: %s: column %q is not in the target (its DDL did not come first)", ErrSchemaChange, t.qname, d.Name)
		}
		switch d.Kind {
		case pgcodec.Unchanged:
			unchanged = append(unchanged, d.Name)
		case pgcodec.Null:
			present, args = append(present, d.Name), append(args, nil)
		default:
			present, args = append(present, d.Name), append(args, text(d.Text))
		}
	}
	for _, k := range t.key {
		j := indexOf(c.From, k)
		if j < 0 || c.From[j].Kind != pgcodec.Text {
			return false, fmt.Errorf("%w: %w: %s: a move without old key column %q", ErrApply, errBadData, t.qname, k)
		}
		args = append(args, text(c.From[j].Text))
	}
	sig := "\x00move\x00" + strings.Join(present, "\x00") + "\x00\x00" + strings.Join(unchanged, "\x00")
	q.add(t.statement(sig, func() string { return t.moveSQL(present, unchanged) }), args...)
	return true, nil
}

// moveFromKey is the batch key of a move's old key: its key columns'
// values as a row key holds them after its index (pgcodec.AppendKey).
func moveFromKey(from []pgcodec.Datum) []byte {
	vals := make([][]byte, len(from))
	for i, d := range from {
		vals[i] = d.Text
	}
	return pgcodec.AppendKey(nil, 0, vals)[4:]
}

package pgsource

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
	"github.com/cdcflow/eventservice/pkg/schemastore"
	"github.com/cdcflow/eventservice/pkg/upstream"
)

// A session decodes one transaction at a time: its rows are routed to
// their table's subscriptions and pushed to the store in chunks, a new
// relation version becomes a DDL at commit-ts - 1, and the commit gives
// the transaction its commit-ts and marks the subscriptions it pushed to.

// handle applies one pgoutput message.
func (ss *session) handle(ctx context.Context, data []byte) error {
	msg, err := parseMessage(data)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	s := ss.s
	switch m := msg.(type) {
	case msgBegin:
		if ss.cur != nil {
			return fmt.Errorf("%w: BEGIN inside a transaction", ErrProtocol)
		}
		ts := max(ss.last+2, common.TsFromTime(m.commitTime))
		ss.cur = &txn{ts: ts, xid: m.xid, pending: map[uint32][]common.Row{}}
		ss.refreshSubs()
		// A subscription that arrives from below ts while this
		// transaction is decoded may have missed its rows: it replays.
		s.mu.Lock()
		s.mu.begun = max(s.mu.begun, ts)
		s.mu.Unlock()
	case msgCommit:
		if ss.cur == nil {
			return fmt.Errorf("%w: COMMIT outside a transaction", ErrProtocol)
		}
		if err := ss.commit(ctx, m); err != nil {
			return err
		}
	case msgRelation:
		return ss.relation(ctx, &m)
	case msgInsert:
		return ss.change(ctx, m.rel, pgcodec.Insert, nil, 0, m.new)
	case msgUpdate:
		return ss.change(ctx, m.rel, pgcodec.Update, m.old, m.oldKind, m.new)
	case msgDelete:
		return ss.change(ctx, m.rel, pgcodec.Delete, m.old, m.oldKind, nil)
	case msgTruncate:
		if ss.cur == nil {
			return fmt.Errorf("%w: TRUNCATE outside a transaction", ErrProtocol)
		}
		for _, oid := range m.rels {
			v := pgcodec.RowChange{Change: pgcodec.Truncate, Cascade: m.cascade, RestartIdentity: m.restartIdentity}
			if err := ss.add(ctx, oid, pgcodec.Truncate, nil, v); err != nil {
				return err
			}
		}
	case msgMessage:
		switch m.prefix {
		case heartbeatPrefix:
			s.met.heartbeats.Inc()
		case copyPrefix:
			return ss.copyMark(ctx, m)
		}
	case msgIgnored:
	}
	return nil
}

// relation records this connection's description of a relation and, if
// it differs from the one known, a DDL at the current commit-ts minus one.
func (ss *session) relation(ctx context.Context, m *msgRelation) error {
	ss.rels[m.oid] = m
	rel, err := ss.describe(ctx, m)
	if err != nil {
		return err
	}
	old, seen := ss.known[m.oid]
	if seen && sameRelation(old, rel) {
		return nil
	}
	if ss.announced[m.oid] && seen && old.Validate() != nil && rel.Validate() == nil {
		// A table whose changes were skipped for want of a key has one
		// now: its next change announces it, as a new table's first.
		delete(ss.announced, m.oid)
	}
	ss.s.relationChanged(m.oid, seen)
	return ss.adopt(rel)
}

// adopt makes rel its table's relation version from the current
// transaction on: a DDL at its commit-ts minus one.
func (ss *session) adopt(rel pgcodec.Relation) error {
	ss.known[rel.OID] = rel
	if ss.cur == nil {
		return nil // outside a transaction: it takes effect at the next one
	}
	ddl := schemastore.DDL{TableID: int64(rel.OID), CommitTs: ss.cur.ts - 1, Query: pgcodec.RelationDDL(rel)}
	if err := ss.s.opts.Schema.AddDDL(ddl); err != nil && !errors.Is(err, schemastore.ErrDDLBeforeFrontier) && !errors.Is(err, schemastore.ErrDuplicateDDL) {
		return fmt.Errorf("pgsource: record the DDL of %s: %w", rel.QualifiedName(), err)
	}
	ss.s.met.ddls.Inc()
	return nil
}

// describe turns a relation message into a pgcodec.Relation: SQL type
// names from the catalog (cached) and the key from the message's flags,
// or, for REPLICA IDENTITY FULL (every column flagged), the primary key.
func (ss *session) describe(ctx context.Context, m *msgRelation) (pgcodec.Relation, error) {
	rel := pgcodec.Relation{OID: m.oid, Schema: m.namespace, Name: m.name}
	var pk map[string]bool
	if m.replicaIdentity == 'f' {
		cols, err := tableColumns(ctx, ss.catalog, m.oid, 'f')
		if err != nil {
			return rel, err
		}
		pk = map[string]bool{}
		for _, c := range cols {
			if c.Key {
				pk[c.Name] = true
			}
		}
	}
	for _, c := range m.columns {
		col := pgcodec.Column{Name: c.name, TypeOID: c.typeOID}
		if known, ok := ss.known[m.oid]; ok {
			for _, kc := range known.Columns {
				if kc.Name == c.name && kc.TypeOID == c.typeOID {
					col = kc
				}
			}
		}
		if col.Type == "" {
			_, seen := ss.known[m.oid]
			if err := ss.newColumn(ctx, m, c, seen, &col); err != nil {
				return rel, err
			}
		}
		col.Key = c.key
		if pk != nil {
			col.Key = pk[c.name]
		}
		rel.Columns = append(rel.Columns, col)
	}
	return rel, nil
}

// newColumn describes a column this session has not seen (added, when
// the relation was known without it): its SQL type name, the base type of
// a created type, and the value the rows that were there before it hold
// (ADD COLUMN ... DEFAULT: no row change carries it). The catalog is read
// as it is now, not as of the stream's position: the value is the one
// kept since the column was added, until a rewrite of the table (VACUUM
// FULL, a column's type changed) writes it into the rows.
func (ss *session) newColumn(ctx context.Context, m *msgRelation, c relColumn, added bool, col *pgcodec.Column) error {
	if err := ss.catalog.QueryRow(ctx, "SELECT format_type($1, $2)", c.typeOID, c.typeMod).Scan(&col.Type); err != nil {
		return fmt.Errorf("pgsource: type %d of %s.%s: %w", c.typeOID, m.name, c.name, err)
	}
	if c.typeOID >= firstUserOID {
		ref := typeRef{oid: c.typeOID, mod: c.typeMod}
		bases, err := baseTypes(ctx, ss.catalog, []typeRef{ref})
		if err != nil {
			return fmt.Errorf("pgsource: base type of %s.%s: %w", m.name, c.name, err)
		}
		if col.Base = bases[ref]; col.Base == "" {
			col.Base = "text"
		}
	}
	if !added {
		return nil // a table new to the session: every row of it is streamed
	}
	var missing *string
	var hasDefault bool
	err := ss.catalog.QueryRow(ctx, `SELECT CASE WHEN atthasmissing THEN (attmissingval::text::text[])[1] END, atthasdef
FROM pg_attribute WHERE attrelid = $1 AND attname = $2 AND NOT attisdropped`, m.oid, c.name).Scan(&missing, &hasDefault)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return fmt.Errorf("pgsource: the value of %s.%s in earlier rows: %w", m.name, c.name, err)
	case missing != nil:
		col.Missing, col.HasMissing = *missing, true
	case hasDefault:
		// Either the default came after the column (the rows keep their
		// NULLs, as the target's do) or adding it rewrote the table (a
		// volatile default, a domain with a constraint): PostgreSQL then
		// wrote the values into the rows, and logical decoding carries no
		// change for a rewrite. Which one, the catalog does not say.
		ss.s.log.Warn("a column added with a default the rows that were there may hold without any change streamed: if adding it rewrote the table, the target's rows have NULL there (compare tells)",
			zap.String("table", pgcodec.QuoteIdent(m.namespace)+"."+pgcodec.QuoteIdent(m.name)), zap.String("column", c.name))
	}
	return nil
}

func sameRelation(a, b pgcodec.Relation) bool {
	if a.Schema != b.Schema || a.Name != b.Name || len(a.Columns) != len(b.Columns) {
		return false
	}
	for i := range a.Columns {
		if a.Columns[i] != b.Columns[i] {
			return false
		}
	}
	return true
}

// change turns an insert, update or delete into rows of the transaction:
// an update that changes the key is a delete of the old key and an insert.
func (ss *session) change(ctx context.Context, oid uint32, c pgcodec.Change, old []tupleCol, oldKind byte, new []tupleCol) error {
	if ss.cur == nil {
		return fmt.Errorf("%w: a change outside a transaction", ErrProtocol)
	}
	m := ss.rels[oid]
	if m == nil {
		return fmt.Errorf("%w: a change of relation %d before its description", ErrProtocol, oid)
	}
	rel := ss.known[oid]
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
	// The key and the datums are built in the session's scratch slices:
	// add encodes them into the row (pgcodec.EncodeRow copies), so one
	// allocation per row is all a change costs here. They alias the
	// message, so they are cleared on the way out: an idle session would
	// otherwise pin its last message's buffer (a large TOASTed value).
	defer ss.clearScratch()
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
		out := ss.datums[:0]
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
		ss.datums = out
		return out
	}
	switch c {
	case pgcodec.Insert:
		key, ok := keyOf(new, ss.keys[0])
		if !ok {
			return fmt.Errorf("%w: %s without a key value", ErrProtocol, rel.QualifiedName())
		}
		ss.keys[0] = key
		return ss.add(ctx, oid, c, key, pgcodec.RowChange{Change: c, Columns: datums(new, false, nil)})
	case pgcodec.Update:
		newKey, ok := keyOf(new, ss.keys[0])
		var fill []tupleCol
		if oldKind == 'O' {
			fill = old
		}
		if !ok && old != nil {
			newKey, ok = keyOf(old, ss.keys[0]) // a key column left unchanged (TOASTed)
		}
		if !ok {
			return fmt.Errorf("%w: an update of %s without a key value", ErrProtocol, rel.QualifiedName())
		}
		ss.keys[0] = newKey
		if old != nil {
			if oldKey, ok := keyOf(old, ss.keys[1]); ok && !sameKey(oldKey, newKey) {
				ss.keys[1] = oldKey
				if cols := datums(new, false, fill); hasUnchanged(cols) {
					// The unchanged value is in the old row only: a move,
					// not a delete and an insert (which would write NULL).
					from := make([]pgcodec.Datum, 0, len(newKey))
					for i, col := range rel.Columns {
						if col.Key {
							from = append(from, pgcodec.Datum{Name: col.Name, Kind: pgcodec.Text, Text: old[i].data})
						}
					}
					return ss.add(ctx, oid, pgcodec.Move, newKey, pgcodec.RowChange{Change: pgcodec.Move, Columns: cols, From: from})
				}
				if err := ss.add(ctx, oid, pgcodec.Delete, oldKey, pgcodec.RowChange{Change: pgcodec.Delete, Columns: datums(old, true, nil)}); err != nil {
					return err
				}
				c = pgcodec.Insert // the new key's row did not exist
			}
		}
		return ss.add(ctx, oid, c, newKey, pgcodec.RowChange{Change: c, Columns: datums(new, false, fill)})
	default: // delete
		key, ok := keyOf(old, ss.keys[0])
		if !ok {
			return fmt.Errorf("%w: a delete of %s without a key value", ErrProtocol, rel.QualifiedName())
		}
		ss.keys[0] = key
		return ss.add(ctx, oid, c, key, pgcodec.RowChange{Change: c, Columns: datums(old, true, nil)})
	}
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
func (ss *session) clearScratch() {
	clear(ss.datums)
	clear(ss.keys[0])
	clear(ss.keys[1])
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
// store once it holds ChunkRows of them. A change of a published table
// nobody subscribed is reported once (OnNewTable) and the slot is held
// before it.
func (ss *session) add(ctx context.Context, oid uint32, c pgcodec.Change, key [][]byte, change pgcodec.RowChange) error {
	t := ss.cur
	s := ss.s
	t.index++
	if len(s.copyTables) > 0 || len(s.copyWindows) > 0 {
		ss.noteCopies(oid, c, key, &change)
	}
	if len(ss.subs[oid]) == 0 {
		ss.unsubscribed(oid, t.ts)
		return nil
	}
	k, v := pgcodec.EncodeRow(t.index, key, change)
	row := common.Row{Op: pgcodec.Op(c), Key: k, Value: v, StartTs: t.ts - 1, CommitTs: t.ts}
	t.pending[oid] = append(t.pending[oid], row)
	s.met.rows.Inc()
	if len(t.pending[oid]) >= s.opts.ChunkRows {
		return ss.flush(ctx, oid, false)
	}
	return nil
}

// unsubscribed handles a change of a table without a subscription.
func (ss *session) unsubscribed(oid uint32, ts common.Ts) {
	if ss.announced[oid] {
		return
	}
	ss.announced[oid] = true
	rel, ok := ss.known[oid]
	if ok && rel.Schema == ToolSchema {
		return // the tool's own state (a FOR ALL TABLES publication includes it): never replicated
	}
	relErr := rel.Validate()
	if !ok {
		rel.OID, relErr = oid, fmt.Errorf("%w: no description of relation %d", ErrNoKey, oid)
	}
	ss.s.announce(rel, relErr, ts)
}

// flush pushes the transaction's pending rows of oid to its subscriptions
// that have not had this commit yet; last marks the commit, and its push
// carries the commit-ts as the subscription's resolved-ts (see commit).
func (ss *session) flush(ctx context.Context, oid uint32, last bool) error {
	t := ss.cur
	rows := t.pending[oid]
	delete(t.pending, oid)
	for _, b := range ss.subs[oid] {
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
			if err := ss.push(ctx, b, batch); err != nil {
				return err
			}
		}
		if last {
			b.have, b.partial = t.ts, 0
			if batch.ResolvedTs != 0 {
				b.resolved = batch.ResolvedTs
			}
		}
	}
	return nil
}

// push hands a batch to a subscription's sink. A closed subscription is
// skipped; a store that is closing ends the session.
func (ss *session) push(ctx context.Context, b *sub, batch eventstore.Batch) error {
	ss.pushContext(ctx)
	return ss.pushed(b, batch, b.guard.Push(ss.pushCtx, ss.pushCancel, batch))
}

// pushContext makes sure the session's push context is live. One push
// context for the session, made again only after a subscription's Close
// cancelled it: a context per push (with its registration in the
// parent's) was a tenth of the stream's CPU.
func (ss *session) pushContext(ctx context.Context) {
	if ss.pushCtx == nil || ss.pushCtx.Err() != nil {
		if ss.pushCancel != nil {
			ss.pushCancel()
		}
		ss.pushCtx, ss.pushCancel = context.WithCancel(ctx)
	}
}

// pushed is what a push of batch to b that returned err means for the
// session: nil to go on, or the error that ends it.
func (ss *session) pushed(b *sub, batch eventstore.Batch, err error) error {
	switch {
	case err == nil, errors.Is(err, upstream.ErrSubscriptionClosed):
		return nil
	case errors.Is(err, eventstore.ErrRowBeforeResolved), errors.Is(err, eventstore.ErrResolvedTsRegressed):
		// A session that reads commits again skips what each subscription
		// has (flush), so the store refusing a push means the two disagree
		// on what was delivered: a row it refused may never reach the
		// dispatchers. Ending the stream would read the same commits into
		// the same refusal, so it goes on, loudly: an error and a counter
		// to alert on, never a debug line.
		ss.s.met.refused.Inc()
		ss.s.log.Error("the store refused a push: rows of this table may be missing downstream",
			zap.Uint32("table", b.oid), zap.Int("rows", len(batch.Rows)), zap.Uint64("resolvedTs", uint64(batch.ResolvedTs)), zap.Error(err))
		return nil
	}
	return fmt.Errorf("pgsource: push to table %d: %w", b.oid, err)
}

// endPushes releases the push context.
func (ss *session) endPushes() {
	if ss.pushCancel != nil {
		ss.pushCancel()
	}
}

// commit ends the transaction: its remaining rows go to the store and the
// chain and the journal move on.
//
// The commit also resolves the tables it wrote: the stream is in commit
// order, so once commit i is decoded no row at or below ts(i) is still to
// come, for any table. So the schema frontier moves to ts(i) first (the
// commit's relation DDLs are at ts(i)-1), then each table the commit wrote
// gets its rows and ts(i) as its resolved-ts in one push: one store write
// and one notification deliver them, at once, instead of the rows waiting
// for the next round of every subscription's resolved-ts (advanceResolved,
// which now only moves tables without commits of their own). At 1000
// tables that round, every 100 ms, was most of serve's work per row.
func (ss *session) commit(ctx context.Context, m msgCommit) error {
	t := ss.cur
	t.endLSN = m.endLSN
	s := ss.s
	if len(t.pending) > 0 || len(t.spilled) > 0 {
		if err := s.opts.Schema.AdvanceResolvedTs(t.ts); err != nil && !errors.Is(err, schemastore.ErrResolvedTsRegressed) {
			return fmt.Errorf("pgsource: schema frontier: %w", err)
		}
	}
	for oid := range t.pending {
		if err := ss.flush(ctx, oid, true); err != nil {
			return err
		}
	}
	// Subscriptions with rows in this commit whose last chunk was pushed
	// early are marked and resolved too (the transaction lists them: a
	// commit costs what it touched, not every subscription).
	for _, b := range t.spilled {
		if b.partial != t.ts {
			continue // its last chunk went with the commit's push above
		}
		b.noteUnapplied(t.ts)
		b.have, b.partial = t.ts, 0
		if t.ts > b.resolved {
			if err := ss.push(ctx, b, eventstore.Batch{ResolvedTs: t.ts}); err != nil {
				return err
			}
			b.resolved = t.ts
		}
	}
	for _, c := range t.copied {
		s.finishCopy(c, t.ts, false)
	}
	s.noteCommit(t.xid)
	ss.last = t.ts
	ss.cur = nil
	ss.journal = append(ss.journal, Position{LSN: t.endLSN, Ts: t.ts})
	if len(ss.journal) > maxJournal {
		// The safe point has not moved for a long while: keep every
		// other entry (the slot's position gets coarser, never wrong:
		// it is chosen at or below the safe point).
		j := ss.journal[:1]
		for i := 2; i < len(ss.journal)-1; i += 2 {
			j = append(j, ss.journal[i])
		}
		ss.journal = append(j, ss.journal[len(ss.journal)-1])
	}
	s.mu.Lock()
	if t.ts > s.mu.committed {
		s.mu.committed = t.ts
	}
	s.mu.Unlock()
	s.lastCommit.Store(s.now().UnixNano())
	s.met.commits.Inc()
	s.met.committedTs.Set(float64(t.ts.PhysicalMs()) / 1000)
	return nil
}

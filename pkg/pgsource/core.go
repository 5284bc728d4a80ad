package pgsource

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

// The WAL core: what the stream decides, as eventservice's owner.step is
// what a session of the scheduler decides. A core is single-threaded (the
// stream goroutine's) and pure: each input (a parsed pgoutput message, the
// relation description the shell read for one, a keepalive's WAL end, a
// tick, the result of a resolved push) changes its state and appends the
// actions to carry out, in order, to its list; it does no I/O, reads no
// clock and takes no lock. What it needs from outside comes in with the
// input: the subscriptions as of a BEGIN, a watermark's registered chunk,
// the copies given up since the last input. The session (stream.go) is
// the thin shell around it: it reads the socket, looks up what an input
// needs, steps the core and carries the actions out (pushes to the store,
// the schema store, announcements, the copier's chunks), feeding results
// back. testdata/core traces it.
//
// What it keeps:
//   - the commit-ts chain: ts(i) = max(ts(i-1) + 2, commit-time(i)), seeded
//     by the position the session started from (see stream.go);
//   - the transaction being decoded, its rows by table, spilled to the
//     store in chunks of chunkRows;
//   - each subscription's progress (have, partial, resolved: the sub's
//     stream-owned fields);
//   - the journal of commit positions since the last confirmed one and the
//     WAL end of the last keepalive between transactions, from which
//     nextConfirm picks what the slot may be confirmed to;
//   - through the stream's state (kept across sessions): the relations
//     known, the copies' windows and the recent commits' xids.
//
// Invariants: a row is pushed with its transaction's commit-ts, and a
// subscription's resolved-ts never passes a commit whose rows it has not
// been pushed; a relation version is recorded as a DDL at commit-ts - 1,
// before the rows that use it; a subscription that already has a commit
// (have) is not pushed its rows again (a session reading the slot again);
// nextConfirm never passes the safe point, a hold, or the last commit
// position at or below them.
type core struct {
	st        *streamState
	chunkRows int
	// skipRecentCheck (tests) turns off the recent-commits check of a
	// copy's chunk.
	skipRecentCheck bool

	last    common.Ts  // the chain: the last commit's ts
	journal []Position // commits since the saved position, thinned
	// walEnd is the WAL end of the last keepalive heard between
	// transactions with the chain's ts then (LSN 0: none): every commit
	// before it was streamed or had nothing published.
	walEnd Position
	cur    *txn
	rels   map[uint32]*msgRelation // this connection's relation messages
	// announced: tables without a subscription reported once.
	announced map[uint32]bool
	// subs are the subscriptions by table as of the transaction's BEGIN.
	subs map[uint32][]*sub

	acts  []action
	tally tally
	// keys and datums are change's scratch, reused for every row (add
	// copies what it keeps).
	keys   [2][][]byte
	datums []pgcodec.Datum
	oids   []uint32 // commit's scratch
}

// streamState is what the stream keeps across its sessions (the stream
// goroutine's): the relation versions known, the copies' windows, the
// xids of the last commits decoded, the sessions in a row that ended
// silent.
type streamState struct {
	known map[uint32]pgcodec.Relation
	// copyWindows are the copy chunks whose window is open, by table;
	// copyTables the copies active on a table.
	copyWindows map[uint32][]*copyChunk
	copyTables  map[uint32]*copyState
	// recentXids are the xids of the last recentCommits commits decoded,
	// recentN the commits decoded.
	recentXids [recentCommits]uint32
	recentN    uint64
	// silentStreak counts the sessions in a row that ended silent
	// (ErrSourceSilent): each doubles the next one's receive timeout.
	silentStreak int
}

func newStreamState(known map[uint32]pgcodec.Relation) *streamState {
	return &streamState{known: known, copyWindows: map[uint32][]*copyChunk{}, copyTables: map[uint32]*copyState{}}
}

// newCore is a session's core, its chain continuing from from.
func newCore(st *streamState, from Position, chunkRows int) *core {
	return &core{st: st, chunkRows: chunkRows, last: from.Ts, journal: []Position{from},
		rels: map[uint32]*msgRelation{}, announced: map[uint32]bool{}}
}

// tally counts what the core decoded, for the shell's metrics.
type tally struct {
	rows, ddls, commits, heartbeats, copyRows int64
}

// txn is the transaction being decoded.
type txn struct {
	ts      common.Ts
	xid     uint32
	endLSN  uint64
	index   uint32
	pending map[uint32][]common.Row // rows not yet pushed, by table
	spilled []*sub                  // subscriptions that were pushed rows of this transaction
	copied  []*copyChunk            // chunks of copies pushed in this transaction
}

// action is one thing the shell carries out, in order.
type action struct {
	kind  actionKind
	ts    common.Ts
	sub   *sub
	batch eventstore.Batch
	ddl   schemastore.DDL
	rel   pgcodec.Relation
	err   error // actAnnounce: why the table cannot be replicated (nil: it can)
	chunk *copyChunk
	retry bool
	subs  []*sub
}

type actionKind uint8

const (
	// actBegin: a transaction began at ts (a subscription that arrives
	// below it replays: Subscribe reads it).
	actBegin actionKind = iota
	// actPush: push batch to sub.
	actPush
	// actFrontier: the schema frontier moves to ts.
	actFrontier
	// actDDL: record ddl, a new relation version.
	actDDL
	// actAnnounce: a table nobody subscribed changed at ts (OnNewTable),
	// or cannot be replicated (err).
	actAnnounce
	// actFinishCopy: a copy's chunk was pushed at ts, or goes back to be
	// read again (retry).
	actFinishCopy
	// actCommitted: a transaction committed at ts.
	actCommitted
	// actResolve: move subs' resolved-ts to ts (one PushResolved); the
	// shell reports each success back (resolvedPushed).
	actResolve
)

var actionNames = [...]string{"begin", "push", "frontier", "ddl", "announce", "finish-copy", "committed", "resolve"}

func (k actionKind) String() string { return actionNames[k] }

// take returns the actions appended since the last take (the slice is the
// core's: valid until the next input).
func (c *core) take() []action {
	a := c.acts
	c.acts = c.acts[:0]
	return a
}

func (c *core) emit(a action) { c.acts = append(c.acts, a) }

// tsOf is the commit-ts the chain gives the transaction m begins.
func (c *core) tsOf(m msgBegin) common.Ts { return max(c.last+2, common.TsFromTime(m.commitTime)) }

// begin starts a transaction; subs are the subscriptions as of it (nil:
// unchanged since the last BEGIN).
func (c *core) begin(m msgBegin, subs map[uint32][]*sub) error {
	if c.cur != nil {
		return fmt.Errorf("%w: BEGIN inside a transaction", ErrProtocol)
	}
	ts := c.tsOf(m)
	c.cur = &txn{ts: ts, xid: m.xid, pending: map[uint32][]common.Row{}}
	if subs != nil {
		c.subs = subs
	}
	c.emit(action{kind: actBegin, ts: ts})
	return nil
}

// commit ends the transaction: its remaining rows are pushed and the
// chain and the journal move on.
//
// The commit also resolves the tables it wrote: the stream is in commit
// order, so once commit i is decoded no row at or below ts(i) is still to
// come, for any table. So the schema frontier moves to ts(i) first (the
// commit's relation DDLs are at ts(i)-1), then each table the commit wrote
// gets its rows and ts(i) as its resolved-ts in one push: one store write
// and one notification deliver them, at once, instead of the rows waiting
// for the next round of every subscription's resolved-ts (tick, which only
// moves tables without commits of their own).
func (c *core) commit(m msgCommit) error {
	t := c.cur
	if t == nil {
		return fmt.Errorf("%w: COMMIT outside a transaction", ErrProtocol)
	}
	t.endLSN = m.endLSN
	if len(t.pending) > 0 || len(t.spilled) > 0 {
		c.emit(action{kind: actFrontier, ts: t.ts})
	}
	c.oids = sortedOIDs(c.oids[:0], t.pending)
	for _, oid := range c.oids {
		c.flush(oid, true)
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
			c.emit(action{kind: actPush, sub: b, batch: eventstore.Batch{ResolvedTs: t.ts}})
			b.resolved = t.ts
		}
	}
	for _, ch := range t.copied {
		c.emit(action{kind: actFinishCopy, chunk: ch, ts: t.ts})
	}
	c.noteCommit(t.xid)
	c.last = t.ts
	c.cur = nil
	c.journal = append(c.journal, Position{LSN: t.endLSN, Ts: t.ts})
	if len(c.journal) > maxJournal {
		// The safe point has not moved for a long while: keep every
		// other entry (the slot's position gets coarser, never wrong:
		// it is chosen at or below the safe point).
		j := c.journal[:1]
		for i := 2; i < len(c.journal)-1; i += 2 {
			j = append(j, c.journal[i])
		}
		c.journal = append(j, c.journal[len(c.journal)-1])
	}
	c.tally.commits++
	c.emit(action{kind: actCommitted, ts: t.ts})
	return nil
}

// sortedOIDs appends a transaction's tables to out in order, so that its
// pushes (and a trace of them) come in one order; out is the core's
// scratch, so a commit allocates nothing for it.
func sortedOIDs(out []uint32, m map[uint32][]common.Row) []uint32 {
	for oid := range m {
		out = append(out, oid)
	}
	slices.Sort(out)
	return out
}

// known returns the relation version in use for oid.
func (c *core) known(oid uint32) (pgcodec.Relation, bool) {
	r, ok := c.st.known[oid]
	return r, ok
}

// relation records this connection's description of a relation (rel, the
// shell's reading of m) and, if it differs from the one known, makes it the
// version in use: a DDL at the current commit-ts minus one.
func (c *core) relation(m *msgRelation, rel pgcodec.Relation) {
	c.rels[m.oid] = m
	old, seen := c.st.known[m.oid]
	if seen && sameRelation(old, rel) {
		return
	}
	if c.announced[m.oid] && seen && old.Validate() != nil && rel.Validate() == nil {
		// A table whose changes were skipped for want of a key has one
		// now: its next change announces it, as a new table's first.
		delete(c.announced, m.oid)
	}
	c.relationChanged(m.oid, seen)
	c.adopt(rel)
}

// adopt makes rel its table's relation version from the current
// transaction on: a DDL at its commit-ts minus one.
func (c *core) adopt(rel pgcodec.Relation) {
	c.st.known[rel.OID] = rel
	if c.cur == nil {
		return // outside a transaction: it takes effect at the next one
	}
	c.emit(action{kind: actDDL, ddl: schemastore.DDL{TableID: int64(rel.OID), CommitTs: c.cur.ts - 1, Query: pgcodec.RelationDDL(rel)}})
	c.tally.ddls++
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

// truncate is a TRUNCATE of tables rels: a row of each in its place in the
// transaction.
func (c *core) truncate(m msgTruncate) error {
	if c.cur == nil {
		return fmt.Errorf("%w: TRUNCATE outside a transaction", ErrProtocol)
	}
	for _, oid := range m.rels {
		c.add(oid, pgcodec.Truncate, nil, pgcodec.RowChange{Change: pgcodec.Truncate, Cascade: m.cascade, RestartIdentity: m.restartIdentity})
	}
	return nil
}

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
		c.noteCopies(oid, kind, key, &change)
	}
	if len(c.subs[oid]) == 0 {
		c.unsubscribed(oid, t.ts)
		return
	}
	k, v := pgcodec.EncodeRow(t.index, key, change)
	row := common.Row{Op: pgcodec.Op(kind), Key: k, Value: v, StartTs: t.ts - 1, CommitTs: t.ts}
	t.pending[oid] = append(t.pending[oid], row)
	c.tally.rows++
	if len(t.pending[oid]) >= c.chunkRows {
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
		rel.OID, relErr = oid, fmt.Errorf("%w: no description of relation %d", ErrNoKey, oid)
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
	for _, b := range c.subs[oid] {
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

// message handles a logical decoding message: a heartbeat, or a copy's
// watermark (chunk: the chunk it names, registered and ready as the shell
// found it under Source.copies; nil: another process's, or given up).
func (c *core) message(m msgMessage, chunk *copyChunk, ready bool) {
	switch m.prefix {
	case heartbeatPrefix:
		c.tally.heartbeats++
	case copyPrefix:
		kind, _, ok := strings.Cut(string(m.content), ":")
		if ok && m.transactional && c.cur != nil && chunk != nil {
			c.copyMark(kind, chunk, ready)
		}
	}
}

// keepalive records the server's WAL end heard between transactions.
func (c *core) keepalive(walEnd uint64) {
	if c.cur == nil && walEnd > c.walEnd.LSN {
		c.walEnd = Position{LSN: walEnd, Ts: c.last}
	}
}

// resolveTarget is the ts every subscription may be resolved to: the last
// commit, below the open transaction and its DDL.
func (c *core) resolveTarget() common.Ts {
	ts := c.last
	if c.cur != nil {
		ts = min(ts, c.cur.ts-2)
	}
	return ts
}

// resolve moves the schema frontier and the subscriptions among all that
// are behind ts to ts (a tick, or a quiesce).
func (c *core) resolve(ts common.Ts, all []*sub) {
	c.emit(action{kind: actFrontier, ts: ts})
	var behind []*sub
	for _, b := range all {
		if ts <= b.resolved || ts <= b.startTs || (b.partial != 0 && b.partial <= ts) {
			continue
		}
		behind = append(behind, b)
	}
	if len(behind) > 0 {
		c.emit(action{kind: actResolve, ts: ts, subs: behind})
	}
}

// resolvedPushed records that b's resolved-ts was pushed to ts.
func (c *core) resolvedPushed(b *sub, ts common.Ts) {
	if ts > b.resolved {
		b.resolved = ts
	}
}

// confirmed records that the slot was confirmed to pos: the journal keeps
// its entries from the last at or below pos.
func (c *core) confirmed(pos Position) {
	i := 0
	for i < len(c.journal)-1 && c.journal[i+1].LSN <= pos.LSN {
		i++
	}
	c.journal = append(c.journal[:0], c.journal[i:]...)
}

// nextConfirm is where the slot may be confirmed: from saved, the latest
// journal entry at or below the safe point (lowered below every hold: a new
// table's first change not yet subscribed), or, once nothing decoded waits
// to be durable, the server's WAL end (walEnd, whose ts is the last commit
// before it). Never past the safe point; saved when it is unknown.
//
// Why the WAL end may be confirmed: a walsender asked to shut down waits
// until its client confirms exactly that (after the last commit come
// aborted transactions, the shutdown checkpoint), and the server's shutdown
// with it. It cannot lose a row: a transaction is skipped on restart only
// if its commit record lies before the confirmed position, and every
// commit before walEnd was decoded (the stream is in order) and is durable
// (its ts is at or below the safe point); walEnd.Ts, the last of them,
// seeds the chain as a commit's position would.
func nextConfirm(saved Position, journal []Position, walEnd Position, safe common.Ts, known bool, holds []common.Ts) Position {
	if !known {
		return saved
	}
	for _, hold := range holds {
		if hold-1 < safe {
			safe = hold - 1
		}
	}
	next := saved
	for _, p := range journal {
		if p.Ts <= safe && p.LSN > next.LSN {
			next = p
		}
	}
	if walEnd.LSN > next.LSN && walEnd.Ts <= safe {
		next = walEnd
	}
	return next
}

// reseedFrom is where a session's commit-ts chain continues: from, unless
// the slot's confirmed flush LSN (final once the session streams: a slot
// serves one walsender) is past it. Then another process of the changefeed
// confirmed more (one that re-attached between a take-over's Open and this
// start), and the server streams from there whatever was asked: the chain
// must continue from the position that process saved there before it
// confirmed (saved, if found), or a commit after it could get a commit-ts
// at or below one that process delivered, and be skipped. Without it the
// chain cannot continue (ErrProtocol, ErrUnknownSlot). A subscription below
// it would miss the commits up to it, gone from the slot: the other
// process confirmed only what its tables had durably applied, so a new
// process subscribing from their checkpoints is never below it, and an
// earlier one that is has been superseded (ErrSlotTakenOver).
func reseedFrom(from Position, confirmed uint64, saved Position, found bool, subs []*sub) (Position, error) {
	if confirmed <= from.LSN {
		return from, nil
	}
	if !found {
		return from, fmt.Errorf("%w: %w: the slot's confirmed flush LSN %d moved past this source's %d, and no position was saved for it",
			ErrProtocol, ErrUnknownSlot, confirmed, from.LSN)
	}
	for _, b := range subs {
		if b.have < saved.Ts {
			return from, fmt.Errorf("%w: table %d has %v, but it confirmed the slot to %d at %v",
				ErrSlotTakenOver, b.oid, b.have, confirmed, saved.Ts)
		}
	}
	return saved, nil
}

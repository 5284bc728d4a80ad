package pgsource

import (
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
// (have) is not pushed its rows again (a session reading the slot again),
// and one that arrives after the session decoded a commit it needed is
// pushed nothing and not resolved until the replay that reads it again;
// nextConfirm never passes the safe point, a hold, or the last commit
// position at or below them.
type core struct {
	st        *streamState
	chunkRows int
	// chunkBytes bounds a table's pending rows of a transaction in bytes
	// besides chunkRows: a chunk of wide rows (a TOASTed value) is pushed
	// at chunkBytes, not held to chunkRows (1024 rows of 64 kB: 64 MiB,
	// then as much again in the store's pebble batch).
	chunkBytes int
	// skipRecentCheck (tests) turns off the recent-commits check of a
	// copy's chunk.
	skipRecentCheck bool

	from    common.Ts  // the ts of the position the session started from
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
	// captured is each table's last DDL capture (ddlcapture.go).
	captured map[uint32]capturedShape
}

func newStreamState(known map[uint32]pgcodec.Relation) *streamState {
	return &streamState{known: known, copyWindows: map[uint32][]*copyChunk{}, copyTables: map[uint32]*copyState{}}
}

// newCore is a session's core, its chain continuing from from.
// defaultChunkBytes is core.chunkBytes: the eventstore's pebble batch
// bound (eventstore.DefaultMaxBatchBytes), so that a chunk is one batch.
const defaultChunkBytes = 4 << 20

func newCore(st *streamState, from Position, chunkRows int) *core {
	return &core{st: st, chunkRows: chunkRows, chunkBytes: defaultChunkBytes, from: from.Ts, last: from.Ts, journal: []Position{from},
		rels: map[uint32]*msgRelation{}, announced: map[uint32]bool{}}
}

// tally counts what the core decoded, for the shell's metrics.
type tally struct {
	rows, ddls, commits, heartbeats, copyRows, badCaptures int64
}

// txn is the transaction being decoded.
type txn struct {
	ts      common.Ts
	xid     uint32
	endLSN  uint64
	index   uint32
	pending map[uint32][]common.Row // rows not yet pushed, by table
	// pendingBytes are the bytes of pending's rows, by table (nil until a
	// row is added).
	pendingBytes map[uint32]int
	spilled      []*sub       // subscriptions that were pushed rows of this transaction
	copied       []*copyChunk // chunks of copies pushed in this transaction
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

// see notes the first time this session's core sees b (at a BEGIN or a
// tick) and reports whether it may push to b: a subscription that arrives
// after the session decoded a commit above both its start and what it
// has missed that commit's rows, so it is pushed nothing and never
// resolved here (its Subscribe asked for a replay, which reads them
// again). Resolving it would let the replay's rows land at or below its
// resolved-ts.
func (c *core) see(b *sub) bool {
	if b.seenBy != c {
		b.seenBy = c
		b.missed = max(b.startTs, b.have, b.resolved, c.from) < c.last
	}
	return !b.missed
}

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
		for _, l := range subs {
			for _, b := range l {
				c.see(b)
			}
		}
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
	_, again := c.rels[m.oid]
	c.rels[m.oid] = m
	old, seen := c.st.known[m.oid]
	if seen && sameRelation(old, rel) {
		if !again && len(c.subs[m.oid]) > 0 {
			// The session's first description of the table is a DDL
			// even if the version known is the same: that one may be
			// the catalog's at Open, past a DDL this session reads
			// again and the target never had (a stop between a DDL and
			// its first row). The sink finds nothing to change if it
			// has it.
			c.adopt(rel)
		}
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

// message handles a logical decoding message: a heartbeat, or a copy's
// watermark (chunk: the chunk it names, registered and ready as the shell
// found it under Source.copies; nil: another process's, or given up).
func (c *core) message(m msgMessage, chunk *copyChunk, ready bool) {
	switch m.prefix {
	case heartbeatPrefix:
		c.tally.heartbeats++
	case ddlPrefix:
		if m.transactional && c.cur != nil {
			c.capture(m.content)
		}
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

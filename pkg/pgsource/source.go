package pgsource

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/pglink"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// Source is a PostgreSQL logical replication source: an
// eventstore.Upstream whose subscriptions are tables, fed from one
// replication stream of a slot (pgoutput). New validates; Open connects,
// checks the source, creates the publication and the slot when missing
// and reports the tables; the embedder then subscribes (through the event
// store); Start copies the initial snapshot if the slot is new and
// streams; Close stops.
//
// Its goroutines: the stream (run: sessions, each a shell around a WAL
// core, stream.go and core.go), the heartbeat, the publication poll and the
// slot statistics (sharing one side connection), and a CopyTable caller's.
// Locking: mu guards the lifecycle and the subscriptions (and the holds
// and the saved position Subscribe checks them against); pub the poll's
// view of the publication; copies the copier's registry of chunks. None is
// held while another is taken, and none across I/O but mu's lifecycle
// checks. What the stream reads on every transaction (begun, committed,
// the subscriptions' version) is atomic, so it takes no lock there.
type Source struct {
	opts Options
	log  *zap.Logger
	met  *metrics
	// knobs are the tests' seams (knobs.go): set before Open, read-only
	// after.
	knobs testingKnobs
	// link logs the source's outages once (the stream reports them; the
	// heartbeat and the poll only look).
	link *pglink.Watch
	// side is the heartbeat's, the poll's and the slot statistics'
	// connection.
	side sideConn
	// slot is the slot's statistics as last read.
	slot slotState
	// walEnd and confirmed are the server's WAL end as last heard and
	// the LSN last confirmed (the behind_bytes gauge).
	walEnd, confirmed atomic.Uint64

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	kick   chan struct{} // capacity 1: a replay or a quiesce was asked for
	// copyNonce tells this process's copy watermarks from another's;
	// copySeq numbers its chunks.
	copyNonce string
	copySeq   atomic.Uint64
	// copyDrops counts the chunks and copies the copier gave up (the
	// stream tells its core when it moved).
	copyDrops atomic.Uint64
	// pub is what the source knows of the publication's tables: those
	// known to be published (Open's, and those announced since:
	// OnNewTable), those the poll found gone from it (left), and their
	// pg_publication_rel rows (membership; 0: none, FOR ALL TABLES). The
	// poll's and the announcements'; taken before mu where both are.
	pub struct {
		sync.Mutex
		published, left map[uint32]bool
		membership      map[uint32]uint32
	}
	// copies are the chunks of copies in flight, by id: the copier
	// registers them, the stream looks them up at their watermarks.
	copies struct {
		sync.Mutex
		m map[string]*copyChunk
	}
	// begun is the ts of the last transaction the stream began (its rows
	// may be decoded already), committed the last commit's: Subscribe
	// reads them to tell a subscription that must read the slot again.
	// subsVersion counts the changes of mu.subs, so that the stream takes
	// the subscriptions again only when they changed (without the lock).
	begun, committed, subsVersion atomic.Uint64

	// Set by Open, read-only after.
	// pubs are the publications the stream reads: Publication, and its
	// companion of inserts (InsertsPublication) when the changefeed
	// manages them.
	pubs     []string
	tables   []catalogTable
	snapshot *pendingSnapshot // nil unless Open created the slot
	resume   Position         // where the stream starts

	// early is the stream OpenStream started, until the first session
	// takes it (or Close closes it); under mu.
	early *earlyStream

	mu struct {
		sync.Mutex
		opened, started, closed bool
		subs                    map[uint32][]*sub    // by table OID
		replay                  bool                 // restart the stream from the slot
		holds                   map[uint32]common.Ts // new tables: the slot stays before these
		saved                   Position             // the slot's position, as last saved
		snapshotDone            bool
		err                     error // why the source stopped, if it did
		// quiesce is a pending Quiesce (nil: none).
		quiesce *quiesceReq
		// quiesced: the stream ended at a Quiesce; it opens no session.
		quiesced bool
		// streamConn is the open session's connection, for poke.
		streamConn interface{ SetReadDeadline(time.Time) error }
	}
	// lastCommit is when the last commit was decoded (clock UnixNano), for
	// the heartbeat.
	lastCommit atomic.Int64
	// copied counts the rows copies pushed (CopiedRows).
	copied atomic.Int64
	// streaming is set while a replication session is open.
	streaming atomic.Bool
	progress  snapshotProgress
}

// pendingSnapshot is the exported snapshot of a slot Open created: its
// connection must stay idle until the copy is done.
type pendingSnapshot struct {
	conn *pgconn.PgConn
	name string
	ts   common.Ts
	lsn  uint64
}

// earlyStream is a replication stream started before Start (OpenStream):
// START_REPLICATION sent from from, nothing read yet.
type earlyStream struct {
	conn    *pgconn.PgConn
	catalog *pgx.Conn
	from    Position
}

func (e *earlyStream) close() {
	_ = e.conn.Close(context.Background())
	_ = e.catalog.Close(context.Background())
}

// sub is one subscription: a table from a start-ts.
type sub struct {
	oid     uint32
	startTs common.Ts
	guard   *eventstore.SinkGuard
	s       *Source

	// unapplied are the commit-ts of the commits whose rows were pushed
	// to it and not yet seen durable downstream, oldest first (Lag); the
	// stream appends, Lag pops. Bounded: past maxUnapplied the newest is
	// overwritten (the oldest, which sets the lag, stays exact).
	lagMu     sync.Mutex
	unapplied []common.Ts

	// Owned by the stream goroutine.
	have     common.Ts // the last commit whose rows were pushed (startTs at first)
	partial  common.Ts // a commit whose rows are being pushed in chunks
	resolved common.Ts // the last resolved-ts pushed
	// seenBy is the session's core that last saw it; missed: it arrived
	// after that session decoded a commit it needed (core.see).
	seenBy *core
	missed bool
}

// New validates opts. It connects to nothing and starts nothing.
func New(opts Options) (*Source, error) {
	opts = opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	s := &Source{opts: opts, log: opts.Logger.Named("pgsource"), kick: make(chan struct{}, 1),
		copyNonce: fmt.Sprintf("%x", rand.Uint64())}
	s.link = pglink.NewWatch(s.log, "the source", opts.Clock.Now)
	s.mu.subs = map[uint32][]*sub{}
	s.mu.holds = map[uint32]common.Ts{}
	s.copies.m = map[string]*copyChunk{}
	s.pub.published, s.pub.left, s.pub.membership = map[uint32]bool{}, map[uint32]bool{}, map[uint32]uint32{}
	var err error
	if s.met, err = newMetrics(s, opts.Registerer); err != nil {
		return nil, err
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// Info is what Open found.
type Info struct {
	// Tables are the published tables, in name order.
	Tables []pgcodec.Relation
	// Created reports that Open created the slot: Start copies a snapshot
	// of every table at SnapshotTs, then streams from its consistent
	// point. A changefeed that wants the rows that exist subscribes from
	// SnapshotTs-1.
	Created    bool
	SnapshotTs common.Ts
	// ResumeTs is the commit-ts the stream resumes after (SnapshotTs for a
	// new slot); no subscription may start below it.
	ResumeTs common.Ts
	// LeftOut are the tables not replicated, with why (not the role's, a
	// description a sink cannot turn into SQL).
	LeftOut []LeftOut
	// InsertsOnly are the replicated tables without a key or REPLICA
	// IDENTITY FULL: only their inserts and truncates are streamed (a
	// publication of their updates makes PostgreSQL refuse them).
	InsertsOnly []string
	// DDLCapture: the source's DDL capture is installed (ddlcapture.go).
	DDLCapture bool
}

// Open connects, checks that the source can be replicated (wal_level,
// every published table has a key: ErrUnreplicable names the first that has
// not), creates the publication and the slot when missing and finds
// where the stream resumes. With ErrUnknownSlot it still reports the
// tables (an embedder that starts over empties their targets).
func (s *Source) Open(ctx context.Context) (Info, error) {
	s.mu.Lock()
	if s.mu.opened || s.mu.closed {
		s.mu.Unlock()
		return Info{}, fmt.Errorf("%w: Open twice or after Close", ErrInvalidOptions)
	}
	s.mu.opened = true
	s.mu.Unlock()
	conn, err := connect(ctx, s.opts.DSN)
	if err != nil {
		return Info{}, err
	}
	defer conn.Close(context.Background())
	// Everything that can fail before anything is created (Check).
	if err := check(ctx, conn, s.opts.Publication, s.opts.Slot); err != nil {
		return Info{}, err
	}
	info := Info{}
	if there, err := s.installCapture(ctx, conn); err != nil {
		s.log.Warn("the DDL capture could not be installed: renames are told apart by place only", zap.Error(err))
	} else {
		info.DDLCapture = there
	}
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)", s.opts.Publication).Scan(&exists); err != nil {
		return Info{}, fmt.Errorf("%w: %w", ErrConnect, err)
	}
	s.pubs = []string{s.opts.Publication}
	if !exists {
		left, err := createPublication(ctx, conn, s.opts.Publication, s.opts.Tables)
		if err != nil {
			return Info{}, err
		}
		s.log.Info("publication created, listing the tables of the changefeed", zap.String("publication", s.opts.Publication),
			zap.String("inserts_only", InsertsPublication(s.opts.Publication)), zap.Int("left_out", len(left)))
		info.LeftOut = append(info.LeftOut, left...)
		s.pubs = append(s.pubs, InsertsPublication(s.opts.Publication))
	} else if s.opts.ManagePublication {
		left, err := s.syncPublication(ctx, conn)
		if err != nil {
			return Info{}, err
		}
		info.LeftOut = append(info.LeftOut, left...)
		s.pubs = append(s.pubs, InsertsPublication(s.opts.Publication))
	}
	if s.tables, err = publishedTables(ctx, conn, s.pubs); err != nil {
		return Info{}, err
	}
	if err := s.seedMembership(ctx, conn); err != nil {
		return Info{}, err
	}
	for _, t := range s.tables {
		if t.relationErr != nil {
			// In a publication the user made: its changes are skipped, as
			// a table's without a key always were (left out, not refused).
			info.LeftOut = append(info.LeftOut, LeftOut{Table: t.schema + "." + t.name, Reason: t.relationErr.Error()})
			continue
		}
		info.Tables = append(info.Tables, t.relation())
		if t.relation().Identity == pgcodec.IdentityNone {
			info.InsertsOnly = append(info.InsertsOnly, t.schema+"."+t.name)
		}
	}
	for _, l := range info.LeftOut {
		s.log.Warn("a table is left out of the changefeed", zap.String("table", l.Table), zap.String("why", l.Reason))
	}
	// The slot's confirmed flush LSN is final only once no walsender is
	// attached: one of a process that just died may still read its last
	// status report.
	if err := checkSlotIsOurs(ctx, conn, s.opts.Slot); err != nil {
		return Info{}, err
	}
	if err := releaseSlot(ctx, conn, s.opts.Slot, s.opts.TakeOver, s.opts.Clock); err != nil {
		return Info{}, err
	}
	lsn, exists, err := slotLSN(ctx, conn, s.opts.Slot)
	if err != nil {
		return Info{}, err
	}
	if exists {
		p, ok, err := s.opts.Positions.Load(ctx, s.opts.Slot, lsn)
		if err != nil {
			return Info{}, fmt.Errorf("pgsource: load the slot's position: %w", err)
		}
		if !ok {
			return info, fmt.Errorf("%w: slot %s at %v: drop it (SELECT pg_drop_replication_slot('%s')) to start over with a snapshot",
				ErrUnknownSlot, s.opts.Slot, pglogrepl.LSN(lsn), s.opts.Slot)
		}
		s.resume = p
	} else {
		snap, err := s.createSlot(ctx)
		if err != nil {
			return Info{}, err
		}
		s.snapshot = snap
		s.resume = Position{LSN: snap.lsn, Ts: snap.ts}
		info.Created, info.SnapshotTs = true, snap.ts
	}
	info.ResumeTs = s.resume.Ts
	s.mu.Lock()
	s.mu.saved = s.resume
	s.committed.Store(uint64(s.resume.Ts))
	s.mu.snapshotDone = s.snapshot == nil
	s.mu.Unlock()
	s.pub.Lock()
	for _, t := range s.tables {
		s.pub.published[t.oid] = true
	}
	s.pub.Unlock()
	return info, nil
}

// createSlot creates the slot with an exported snapshot and saves its
// first position: the consistent point, at the snapshot's commit-ts.
func (s *Source) createSlot(ctx context.Context) (*pendingSnapshot, error) {
	conn, err := connectReplication(ctx, s.opts.DSN, s.opts.ReadLinger)
	if err != nil {
		return nil, err
	}
	res, err := pglogrepl.CreateReplicationSlot(ctx, conn, s.opts.Slot, "pgoutput",
		pglogrepl.CreateReplicationSlotOptions{SnapshotAction: "EXPORT_SNAPSHOT", Mode: pglogrepl.LogicalReplication})
	if err != nil {
		_ = conn.Close(context.Background())
		return nil, fmt.Errorf("pgsource: create slot %s: %w", s.opts.Slot, err)
	}
	lsn, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		_ = conn.Close(context.Background())
		return nil, fmt.Errorf("%w: consistent point %q", ErrProtocol, res.ConsistentPoint)
	}
	snap := &pendingSnapshot{conn: conn, name: res.SnapshotName, lsn: uint64(lsn), ts: common.TsFromTime(s.opts.Clock.Now())}
	if err := s.opts.Positions.Save(ctx, s.opts.Slot, Position{LSN: snap.lsn, Ts: snap.ts}); err != nil {
		_ = conn.Close(context.Background())
		return nil, fmt.Errorf("pgsource: save the slot's first position: %w", err)
	}
	s.log.Info("replication slot created", zap.String("slot", s.opts.Slot), zap.Stringer("consistent_point", lsn),
		zap.Stringer("snapshot_ts", snap.ts))
	return snap, nil
}

// Subscribe implements eventstore.Upstream: span is a whole table (its
// TableID the relation's OID). A subscription from a start-ts the stream
// has passed restarts the stream from the slot (the rows are read again,
// never invented); one from below what the slot retains is
// ErrStartTsTruncated.
func (s *Source) Subscribe(span common.Span, startTs common.Ts, sink eventstore.Sink) (eventstore.Subscription, error) {
	if sink == nil {
		return nil, fmt.Errorf("%w: nil sink", ErrInvalidOptions)
	}
	if len(span.StartKey) != 0 || len(span.EndKey) != 0 || span.TableID < 0 || span.TableID > math.MaxUint32 {
		return nil, fmt.Errorf("%w: %v", ErrUnsupportedSpan, span)
	}
	oid := uint32(span.TableID)
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.mu.closed:
		return nil, ErrClosed
	case !s.mu.opened:
		return nil, fmt.Errorf("%w: Subscribe before Open", ErrInvalidOptions)
	case s.mu.snapshotDone && startTs < s.mu.saved.Ts:
		return nil, fmt.Errorf("%w: table %d from %v, the slot resumes after %v", ErrStartTsTruncated, oid, startTs, s.mu.saved.Ts)
	}
	b := &sub{oid: oid, startTs: startTs, guard: eventstore.NewSinkGuard(sink), s: s, have: startTs, resolved: startTs}
	s.mu.subs[oid] = append(s.mu.subs[oid], b)
	s.subsVersion.Add(1)
	if hold, ok := s.mu.holds[oid]; ok && startTs < hold {
		delete(s.mu.holds, oid)
	}
	// After the version bump: a stream that took the subscriptions before
	// it stored begun first (decode.go), so it either has this one or
	// shows here the transaction it is decoding.
	if s.mu.started && s.mu.snapshotDone && (startTs < common.Ts(s.committed.Load()) || startTs < common.Ts(s.begun.Load())) {
		// The stream has passed startTs: read it again from the slot.
		s.mu.replay = true
		s.pokeLocked()
	}
	return b, nil
}

// Close implements eventstore.Subscription.
func (b *sub) Close() {
	if !b.guard.Close() {
		return
	}
	s := b.s
	s.mu.Lock()
	defer s.mu.Unlock()
	list := s.mu.subs[b.oid]
	for i, x := range list {
		if x == b {
			s.mu.subs[b.oid] = append(list[:i:i], list[i+1:]...)
			break
		}
	}
	if len(s.mu.subs[b.oid]) == 0 {
		delete(s.mu.subs, b.oid)
	}
	s.subsVersion.Add(1)
}

// OpenStream starts the stream of a slot Open resumed (START_REPLICATION
// from where Start would start it) without reading it, so that the
// walsender does what it must before sending anything while the caller
// subscribes its tables: it decodes again the WAL from the slot's restart
// point to its confirmed position (the restart point moves only at a
// running-xacts record decoded and confirmed, up to two of the server's
// 15 s intervals behind), much of it after a busy stream, and
// connects and starts its decoding context. Start's first session reads
// this stream; Close closes it if Start never ran. Nothing answers the
// server until Start: a Start later than the server's wal_sender_timeout
// (60 s by default) finds the stream ended, and its first session connects
// again (nothing lost, nothing gained). Optional; after Open, before
// Start, once; not on a slot Open created (its snapshot is copied first,
// and the stream starts on the slot's own connection).
func (s *Source) OpenStream(ctx context.Context) error {
	s.mu.Lock()
	switch {
	case s.mu.closed:
		s.mu.Unlock()
		return ErrClosed
	case !s.mu.opened || s.mu.started || s.early != nil || s.snapshot != nil:
		s.mu.Unlock()
		return fmt.Errorf("%w: OpenStream needs a resumed slot, after Open and before Start, once", ErrInvalidOptions)
	}
	from := s.mu.saved
	s.mu.Unlock()
	conn, catalog, err := s.startStream(ctx, from)
	if err != nil {
		return err
	}
	e := &earlyStream{conn: conn, catalog: catalog, from: from}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed || s.mu.started {
		e.close()
		return fmt.Errorf("%w: OpenStream raced Close or Start", ErrInvalidOptions)
	}
	s.early = e
	return nil
}

// takeEarly returns the stream OpenStream started, if it starts at from
// (nil otherwise: one that does not is closed).
func (s *Source) takeEarly(from Position) *earlyStream {
	s.mu.Lock()
	e := s.early
	s.early = nil
	s.mu.Unlock()
	if e != nil && e.from != from {
		e.close()
		return nil
	}
	return e
}

// Start copies the snapshot (if Open created the slot) and streams, until
// Close. It fails after Close or twice.
func (s *Source) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.mu.closed:
		return ErrClosed
	case !s.mu.opened || s.mu.started:
		return fmt.Errorf("%w: Start needs one Open and starts once", ErrInvalidOptions)
	}
	s.mu.started = true
	s.wg.Go(s.run)
	s.wg.Go(s.runHeartbeat)
	s.wg.Go(s.runSlotStats)
	if s.opts.PublicationPollInterval > 0 {
		s.wg.Go(s.runPublicationPoll)
	}
	return nil
}

// Close stops the stream and the heartbeat and waits for them. The
// subscriptions' sinks are called no more.
func (s *Source) Close() {
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return
	}
	s.mu.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	s.side.close() // its tasks have stopped
	if s.snapshot != nil && s.snapshot.conn != nil {
		_ = s.snapshot.conn.Close(context.Background())
	}
	if e := s.takeEarly(Position{}); e != nil { // never started, or ended before its first session
		e.close()
	}
	s.met.unregister()
}

// Err returns why the stream stopped for good (a protocol violation, a
// slot that vanished), or nil while it runs or retries.
func (s *Source) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.err
}

// Streaming reports whether a replication session is open (for a
// readiness check).
func (s *Source) Streaming() bool { return s.streaming.Load() }

// Position returns the slot's position as last saved and confirmed.
func (s *Source) Position() Position {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.saved
}

// Committed returns the commit-ts of the last commit decoded.
func (s *Source) Committed() common.Ts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return common.Ts(s.committed.Load())
}

// subsFor returns the subscriptions of table oid (a copy).
func (s *Source) subsFor(oid uint32) []*sub {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*sub(nil), s.mu.subs[oid]...)
}

// allSubs returns every subscription (a copy).
func (s *Source) allSubs() []*sub {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*sub
	for _, l := range s.mu.subs {
		out = append(out, l...)
	}
	return out
}

// CopiedRows returns the rows CopyTable's copies have pushed so far, all
// tables together (for a progress line).
func (s *Source) CopiedRows() int64 { return s.copied.Load() }

// now is the clock's time.
func (s *Source) now() time.Time { return s.opts.Clock.Now() }

// maxUnapplied bounds a subscription's list of unapplied commits.
const maxUnapplied = 4096

// noteUnapplied records that commit ts pushed rows to b.
func (b *sub) noteUnapplied(ts common.Ts) {
	b.lagMu.Lock()
	if n := len(b.unapplied); n >= maxUnapplied {
		b.unapplied[n-1] = ts
	} else if n == 0 || b.unapplied[n-1] < ts {
		b.unapplied = append(b.unapplied, ts)
	}
	b.lagMu.Unlock()
}

// Lag is how long the oldest change pushed to a subscription has waited
// to be durable downstream, at now (durable gives a table's durable
// checkpoint: the change's commit-ts at or below it is applied); 0 when
// every change decoded is durable. Unlike the age of the lowest
// checkpoint, an idle table costs it nothing (its checkpoint lags its
// resolved-ts by up to a checkpoint interval, but it has nothing to
// apply), and a busy one counts from its oldest change, not its last.
func (s *Source) Lag(durable func(oid uint32) (common.Ts, bool), now time.Time) time.Duration {
	var oldest common.Ts
	for _, b := range s.allSubs() {
		d, ok := durable(b.oid)
		b.lagMu.Lock()
		i := 0
		for ok && i < len(b.unapplied) && b.unapplied[i] <= d {
			i++
		}
		if i > 0 {
			b.unapplied = append(b.unapplied[:0], b.unapplied[i:]...)
		}
		if len(b.unapplied) > 0 && (oldest == 0 || b.unapplied[0] < oldest) {
			oldest = b.unapplied[0]
		}
		b.lagMu.Unlock()
	}
	if oldest == 0 {
		return 0
	}
	return max(0, now.Sub(oldest.Physical()))
}

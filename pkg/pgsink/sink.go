package pgsink

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/pgdial"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventcollector"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

var _ eventcollector.AsyncSink = (*Sink)(nil)

// Sink applies changes to a PostgreSQL target. New validates; Start
// connects and prepares the checkpoint table; Bind each dispatcher to its
// table (before the collector registers it); Close stops.
type Sink struct {
	opts  Options
	log   *zap.Logger
	met   *metrics
	lanes []*lane

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	durableFn func(id common.DispatcherID, epoch uint64, ts common.Ts)
	// leftFn reports whether a source table left the changefeed
	// (SetLeft); nil: none is known to have.
	leftFn func(oid uint32) bool
	// generation is the owner's generation this sink writes at (Start
	// sets it before any lane runs; read-only after).
	generation int64
	// wrote: a sink of the owner had written the target's tables (since
	// the last Reset) when this one started (read-only after Start);
	// marked: the target's wrote marker is known to be set (fence.go).
	wrote  bool
	marked atomic.Bool
	// supersededCh is closed when mu.superseded is set.
	supersededCh chan struct{}
	// draining: Drain was called; checkpoint-only work is committed at
	// once, not every CheckpointInterval.
	draining atomic.Bool

	// admin is the connection binds create and read tables on (one at a
	// time: a thousand tables must not cost a thousand connections).
	adminMu sync.Mutex
	admin   *pgx.Conn

	mu struct {
		sync.Mutex
		started, closed bool
		superseded      bool // a later sink of the owner started (fence.go)
		bound           map[common.DispatcherID]*binding
		durable         map[common.DispatcherID]common.Ts
		errs            map[common.DispatcherID]error
		stopped         map[common.DispatcherID]string
	}
}

// binding is a dispatcher's table and lane.
type binding struct {
	rel  pgcodec.Relation
	lane *lane
}

// New validates opts. It connects to nothing and starts nothing.
func New(opts Options) (*Sink, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	s := &Sink{opts: opts, log: opts.Logger.Named("pgsink"), supersededCh: make(chan struct{})}
	s.mu.bound = map[common.DispatcherID]*binding{}
	s.mu.durable = map[common.DispatcherID]common.Ts{}
	s.mu.errs = map[common.DispatcherID]error{}
	s.mu.stopped = map[common.DispatcherID]string{}
	var err error
	if s.met, err = newMetrics(s, opts.Registerer); err != nil {
		return nil, err
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// Start connects the lanes and creates the checkpoint table if missing.
func (s *Sink) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return ErrClosed
	}
	if s.mu.started {
		return nil
	}
	conn, err := s.connect(ctx)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrConnect, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, schemaSQL); err != nil {
		return fmt.Errorf("%w: the cdcflow schema: %w", ErrConnect, err)
	}
	// Before anything is read or written: an earlier sink of the owner
	// may still have a transaction on its way to commit (fence.go).
	if s.generation, s.wrote, err = acquireFence(ctx, conn, s.opts.Owner, s.opts.FenceWait, s.opts.SoleOwner); err != nil {
		if errors.Is(err, ErrAnotherOwner) {
			return err
		}
		return fmt.Errorf("%w: fence owner %q: %w", ErrConnect, s.opts.Owner, err)
	}
	s.marked.Store(s.wrote)
	// The lanes connect at once: one after another they took a round trip
	// and a backend's start each of a restart's start-up, the stream not
	// yet started.
	conns := make([]*pgx.Conn, s.opts.Workers)
	errs := make([]error, s.opts.Workers)
	var wg sync.WaitGroup
	for i := range conns {
		wg.Go(func() { conns[i], errs[i] = s.connect(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, c := range conns {
			if c != nil {
				c.Close(context.Background())
			}
		}
		return fmt.Errorf("%w: lanes: %w", ErrConnect, err)
	}
	for i, c := range conns {
		s.lanes = append(s.lanes, newLane(s, i, c))
	}
	s.mu.started = true
	for _, l := range s.lanes {
		s.wg.Go(l.run)
	}
	return nil
}

// connect opens a connection to the target (a lane's prepares its own
// statements, pipeline.go, outside pgx's statement cache).
//
// Every connection of a sink may hold the owner's fence lock (fence.go),
// which a later sink's Start waits for, so none may keep it when its
// client is gone: idle_in_transaction_session_timeout ends a transaction
// left open between statements, TCP keepalives a connection whose host is
// gone while the server waits for the rest of a pipeline (about 25 s),
// tcp_user_timeout one whose host is gone while the server's own writes
// go unacknowledged (30 s),
// and READ COMMITTED, whatever the target's default, makes the fence's
// read of the owner's generation see the later sink's commit it waited
// for (a snapshot taken at the transaction's start would not).
func (s *Sink) connect(ctx context.Context) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(s.opts.DSN)
	if err != nil {
		return nil, err
	}
	for k, v := range pgcodec.TextFormatParams() { // the source's values are text in them
		cfg.RuntimeParams[k] = v
	}
	pgdial.Apply(&cfg.Config) // and this side notices a dead target (package pgdial)
	for k, v := range map[string]string{
		"idle_in_transaction_session_timeout": "30s",
		"default_transaction_isolation":       "read committed",
		"tcp_keepalives_idle":                 "10",
		"tcp_keepalives_interval":             "5",
		"tcp_keepalives_count":                "3",
		"tcp_user_timeout":                    "30000",
	} {
		cfg.RuntimeParams[k] = v
	}
	return pgx.ConnectConfig(ctx, cfg)
}

// adminConn returns the admin connection, (re)connecting it, held until
// release.
func (s *Sink) adminConn(ctx context.Context) (*pgx.Conn, func(), error) {
	s.adminMu.Lock()
	if s.admin == nil || s.admin.IsClosed() {
		c, err := s.connect(ctx)
		if err != nil {
			s.adminMu.Unlock()
			return nil, nil, fmt.Errorf("%w: %w", ErrConnect, err)
		}
		s.admin = c
	}
	return s.admin, s.adminMu.Unlock, nil
}

// Checkpoints returns the checkpoints the target holds, by dispatcher: a
// restart resumes each dispatcher from its own.
func (s *Sink) Checkpoints(ctx context.Context) (map[common.DispatcherID]common.Ts, error) {
	conn, release, err := s.adminConn(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	rows, err := conn.Query(ctx, "SELECT dispatcher, ts FROM cdcflow.checkpoints")
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[common.DispatcherID]common.Ts{}
	for rows.Next() {
		var key string
		var ts int64
		if err := rows.Scan(&key, &ts); err != nil {
			return nil, err
		}
		var id common.DispatcherID
		if _, err := fmt.Sscanf(key, "%016x%016x", &id.Hi, &id.Lo); err != nil {
			continue // not one of ours
		}
		out[id] = common.Ts(ts)
	}
	return out, rows.Err()
}

// Binding is a dispatcher's table and where it resumes.
type Binding struct {
	ID  common.DispatcherID
	Rel pgcodec.Relation
	// StartTs is the dispatcher's durable checkpoint until the sink
	// persists a later one.
	StartTs common.Ts
}

// Bind maps dispatcher id to rel's target table (created when missing),
// resuming from startTs.
func (s *Sink) Bind(ctx context.Context, id common.DispatcherID, rel pgcodec.Relation, startTs common.Ts) error {
	return s.BindAll(ctx, []Binding{{ID: id, Rel: rel, StartTs: startTs}})
}

// BindAll binds many dispatchers at once: the missing tables are created
// in one round trip and one transaction, and every table's columns are
// read in one query (a thousand tables must not take a thousand commits).
// A target table that exists but does not match its relation stops that
// table.
func (s *Sink) BindAll(ctx context.Context, bs []Binding) error {
	s.mu.Lock()
	started := s.mu.started
	s.mu.Unlock()
	if !started {
		return fmt.Errorf("%w: Bind before Start", ErrInvalidOptions)
	}
	var fresh []pgcodec.Relation
	for _, b := range bs {
		if err := b.Rel.Validate(); err != nil {
			return err
		}
		if !s.laneFor(b.Rel.OID).has(b.Rel.OID) {
			fresh = append(fresh, b.Rel)
		}
	}
	conn, release, err := s.adminConn(ctx)
	if err != nil {
		return err
	}
	defer release()
	has, err := createdTypes(ctx, conn, fresh...)
	if err != nil {
		return fmt.Errorf("%w: read types: %w", ErrApply, err)
	}
	// A restart binds tables the target has: only those it lacks are
	// created (a thousand CREATE TABLE IF NOT EXISTS took a restart's
	// start-up 35 ms, the stream not yet started).
	missing, err := missingTables(ctx, conn, fresh)
	if err != nil {
		return fmt.Errorf("%w: read tables: %w", ErrApply, err)
	}
	var creates []string
	for _, r := range fresh {
		if missing[r.QualifiedName()] {
			creates = append(creates, createTableSQL(r, has))
		}
	}
	tables := map[uint32]*table{}
	if len(creates) > 0 {
		if _, err := conn.Exec(ctx, "BEGIN; "+strings.Join(creates, "; ")+"; COMMIT"); err != nil {
			return fmt.Errorf("%w: create tables: %w", ErrApply, err)
		}
	}
	if len(fresh) > 0 {
		if tables, err = loadTables(ctx, conn, fresh); err != nil {
			return fmt.Errorf("%w: read tables: %w", ErrApply, err)
		}
		s.logBaseTypes(tables)
	}
	taken, written, err := s.claimTargets(ctx, conn, bs)
	if err != nil {
		return err
	}
	owning, err := s.ownColumns(ctx, conn, tables, written)
	if err != nil {
		return err
	}
	warm := map[*lane][]*table{}
	for _, b := range bs {
		_, stopped := taken[b.ID]
		if o, ok := taken[b.ID]; ok {
			s.failed(b.ID, fmt.Errorf("%w: %s holds the rows of source table %d, not of %d (dropped and created again, or "+
				"renamed away, while this process ran): a restart empties it for this table once that one has left the changefeed",
				ErrTargetTaken, b.Rel.QualifiedName(), o.oid, b.Rel.OID), true)
		}
		l := s.laneFor(b.Rel.OID)
		if t := tables[b.Rel.OID]; t != nil {
			if err := owning[b.Rel.OID]; err != nil {
				s.failed(b.ID, err, true)
				stopped = true
			} else if _, err := t.evolve(b.Rel, has); err != nil {
				s.failed(b.ID, err, true) // an existing target table that does not match
				stopped = true
			}
			if t = l.attach(b.ID, t); !stopped {
				warm[l] = append(warm[l], t)
			}
		} else if !l.has(b.Rel.OID) {
			return fmt.Errorf("%w: table %s was not created", ErrApply, b.Rel.QualifiedName())
		} else {
			l.attach(b.ID, &table{rel: b.Rel})
		}
		s.mu.Lock()
		s.mu.bound[b.ID] = &binding{rel: b.Rel, lane: l}
		if s.mu.durable[b.ID] < b.StartTs {
			s.mu.durable[b.ID] = b.StartTs
		}
		s.mu.Unlock()
	}
	for l, ts := range warm {
		l.queueWarm(ts) // while the stream has sent nothing yet (warm.go)
	}
	return nil
}

// hexID is id as cdcflow.checkpoints keys it.
func hexID(id common.DispatcherID) string { return fmt.Sprintf("%016x%016x", id.Hi, id.Lo) }

// logBaseTypes says which columns of tables, as the target has them, are
// of a created type's base type rather than the type itself: a table this
// sink created (one the user created first keeps the types it has).
func (s *Sink) logBaseTypes(tables map[uint32]*table) {
	for _, t := range tables {
		for _, c := range t.rel.Columns {
			if c.Base != "" && t.types[c.Name] == c.Base && c.Base != c.Type {
				s.log.Info("column of a created type stored as its base type", zap.String("table", t.qname),
					zap.String("column", c.Name), zap.String("source_type", c.Type), zap.String("target_type", c.Base))
			}
		}
	}
}

// laneFor is the lane of table oid.
func (s *Sink) laneFor(oid uint32) *lane {
	h := fnv.New32a()
	fmt.Fprint(h, oid)
	return s.lanes[int(h.Sum32()%uint32(len(s.lanes)))]
}

// Unbind forgets a dispatcher (its table removed from the changefeed).
func (s *Sink) Unbind(id common.DispatcherID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.mu.bound, id)
	delete(s.mu.durable, id)
}

// SetLeft tells the sink which source tables (by OID) have left the
// changefeed: a target table written only by such tables is emptied when
// a table of its name is bound. Without it such a table stops instead
// (ErrTargetTaken). Set before Bind; not safe to call concurrently with it.
func (s *Sink) SetLeft(left func(oid uint32) bool) { s.leftFn = left }

// SetDurable implements eventcollector.AsyncSink.
func (s *Sink) SetDurable(f func(id common.DispatcherID, epoch uint64, ts common.Ts)) {
	s.durableFn = f
}

// MinDurable returns the lowest durable checkpoint of the bound
// dispatchers (ok false with none): what the source's slot may follow.
func (s *Sink) MinDurable() (common.Ts, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var lo common.Ts
	ok := false
	for id := range s.mu.bound {
		ts := s.mu.durable[id]
		if !ok || ts < lo {
			lo, ok = ts, true
		}
	}
	return lo, ok
}

// Durable returns a dispatcher's durable checkpoint.
func (s *Sink) Durable(id common.DispatcherID) common.Ts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.durable[id]
}

// Connected reports whether every lane's connection to the target is
// open (for a readiness check).
func (s *Sink) Connected() bool {
	for _, l := range s.lanes {
		if !l.connected() {
			return false
		}
	}
	return len(s.lanes) > 0
}

// Stopped names the tables stopped by a schema change the sink cannot
// apply (or changes the target kept refusing), with why, sorted.
func (s *Sink) Stopped() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.mu.stopped))
	for _, why := range s.mu.stopped {
		out = append(out, why)
	}
	sort.Strings(out)
	return out
}

// laneOf returns id's lane and any error its last work left, which the
// caller returns (the collector then resets the dispatcher).
func (s *Sink) laneOf(id common.DispatcherID) (*lane, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return nil, false, ErrClosed
	}
	b := s.mu.bound[id]
	if b == nil {
		return nil, false, fmt.Errorf("%w: %v", ErrUnknownDispatcher, id)
	}
	if err := s.mu.errs[id]; err != nil {
		delete(s.mu.errs, id)
		return nil, false, err
	}
	_, stopped := s.mu.stopped[id]
	return b.lane, stopped || s.mu.superseded, nil
}

// BeginEpoch implements eventcollector.Sink.
func (s *Sink) BeginEpoch(id common.DispatcherID, epoch uint64, startTs common.Ts) error {
	s.mu.Lock()
	delete(s.mu.errs, id) // the reset the error asked for
	s.mu.Unlock()
	l, stopped, err := s.laneOf(id)
	if err != nil || stopped {
		return err
	}
	return l.enqueue(op{kind: opBegin, id: id, epoch: epoch, ts: startTs})
}

// ApplyRows implements eventcollector.Sink: the rows are queued.
func (s *Sink) ApplyRows(id common.DispatcherID, rows []common.Row) error {
	l, stopped, err := s.laneOf(id)
	if err != nil || stopped {
		return err
	}
	return l.enqueue(op{kind: opRows, id: id, rows: rows})
}

// ApplyDDL implements eventcollector.Sink: a relation DDL is queued.
func (s *Sink) ApplyDDL(id common.DispatcherID, ddl *messaging.DDL) error {
	l, stopped, err := s.laneOf(id)
	if err != nil || stopped {
		return err
	}
	return l.enqueue(op{kind: opDDL, id: id, ddl: ddl.Query})
}

// Checkpoint implements eventcollector.Sink: the checkpoint is queued
// behind the rows; it is durable once reported through SetDurable's
// function.
func (s *Sink) Checkpoint(id common.DispatcherID, ts common.Ts) error {
	l, stopped, err := s.laneOf(id)
	if err != nil || stopped {
		return err
	}
	return l.enqueue(op{kind: opCheckpoint, id: id, ts: ts})
}

// Drain prepares a clean stop: from now on a dispatcher's checkpoint is
// committed as soon as its lane takes it, rows or not (CheckpointInterval
// no longer holds an idle table's back), so that every table's durable
// checkpoint can reach the source's last commit before the process exits
// (pgsource.Source.Quiesce waits for that).
func (s *Sink) Drain() {
	s.draining.Store(true)
	for _, l := range s.lanes {
		l.mu.Lock()
		l.ring()
		l.mu.Unlock()
	}
}

// Close stops the lanes (work not committed is dropped: it is above the
// durable checkpoints and will be delivered again) and waits for them.
func (s *Sink) Close() {
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return
	}
	s.mu.closed = true
	s.mu.Unlock()
	s.cancel()
	for _, l := range s.lanes {
		l.close()
	}
	s.wg.Wait()
	for _, l := range s.lanes {
		l.conn.Close(context.Background())
	}
	s.adminMu.Lock()
	if s.admin != nil {
		s.admin.Close(context.Background())
	}
	s.adminMu.Unlock()
	s.met.unregister()
}

// committed records what a lane's transaction made durable.
func (s *Sink) committed(done []durableMark) {
	s.mu.Lock()
	for _, d := range done {
		if s.mu.bound[d.id] != nil && d.ts > s.mu.durable[d.id] {
			s.mu.durable[d.id] = d.ts
		}
	}
	s.mu.Unlock()
	if s.durableFn != nil {
		for _, d := range done {
			s.durableFn(d.id, d.epoch, d.ts)
		}
	}
}

// failed records a dispatcher's error for its next call; stop also stops
// its table.
func (s *Sink) failed(id common.DispatcherID, err error, stop bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if stop {
		if _, was := s.mu.stopped[id]; !was {
			s.mu.stopped[id] = err.Error()
			s.met.stopped.Inc()
			s.log.Error("table stopped", zap.Stringer("dispatcher", id), zap.Error(err))
		}
		return
	}
	s.mu.errs[id] = err
}

// State returns the value of key in the target's cdcflow.state (ok false
// if unset): what an embedder records next to the checkpoints.
func (s *Sink) State(ctx context.Context, key string) (string, bool, error) {
	conn, release, err := s.adminConn(ctx)
	if err != nil {
		return "", false, err
	}
	defer release()
	var v string
	err = conn.QueryRow(ctx, "SELECT value FROM cdcflow.state WHERE key = $1", key).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", false, nil
	}
	return v, err == nil, err
}

// SetState sets key to value in cdcflow.state.
// It is fenced: a superseded sink gets ErrSuperseded and writes nothing.
func (s *Sink) SetState(ctx context.Context, key, value string) error {
	return s.fenced(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "INSERT INTO cdcflow.state (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value", key, value)
		return err
	})
}

// Reset empties the target tables of rels and the ones cdcflow.checkpoints
// names (those that exist, outside the cdcflow schema) and forgets every
// checkpoint and state and the owner's wrote marker, in one fenced
// transaction: a changefeed starting over from a new snapshot.
// Interrupted, it did nothing; done, it left nothing of the earlier
// changefeed. It is meant before any dispatcher is bound; the target's
// cdcflow schema holds one changefeed's checkpoints and state (one
// changefeed per target database).
func (s *Sink) Reset(ctx context.Context, rels []pgcodec.Relation) error {
	names := make([]string, len(rels))
	for i, r := range rels {
		names[i] = r.QualifiedName()
	}
	return s.fenced(ctx, func(tx pgx.Tx) error {
		// The checkpoints' targets were written by a sink (quoted as
		// pgcodec.QualifiedName quotes), but they are read back from a
		// database: a name is only compared with the relations' names
		// quoted alike, never parsed, and becomes SQL only as a relation
		// that exists, quoted by the server.
		rows, err := tx.Query(ctx, `
SELECT DISTINCT format('%I.%I', n.nspname, c.relname)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
JOIN (SELECT unnest($1::text[]) UNION SELECT target FROM cdcflow.checkpoints) AS t(name)
  ON t.name = '"' || replace(n.nspname, '"', '""') || '"."' || replace(c.relname, '"', '""') || '"'
WHERE c.relkind IN ('r', 'p') AND n.nspname <> 'cdcflow'`, names)
		if err != nil {
			return err
		}
		tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		if len(tables) > 0 {
			if _, err := tx.Exec(ctx, "TRUNCATE "+strings.Join(tables, ", ")); err != nil {
				return fmt.Errorf("%w: truncate %s: %w", ErrApply, strings.Join(tables, ", "), err)
			}
		}
		if _, err = tx.Exec(ctx, "DELETE FROM cdcflow.checkpoints; DELETE FROM cdcflow.state"); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, "UPDATE cdcflow.owners SET wrote = false WHERE owner = $1", s.opts.Owner)
		return err
	}, func() { s.marked.Store(false) })
}

// ClearProgress forgets every checkpoint and state record, in one fenced
// transaction, leaving the tables as they are: a changefeed starting from
// a new snapshot on a target it never wrote to (Wrote false), whose
// records belong to an earlier slot.
func (s *Sink) ClearProgress(ctx context.Context) error {
	return s.fenced(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "DELETE FROM cdcflow.checkpoints; DELETE FROM cdcflow.state")
		return err
	})
}

// Generation is the owner's generation this sink writes at: 1 for the
// first sink of its owner on the target, more if earlier ones started
// there (whether they wrote anything is Wrote's).
func (s *Sink) Generation() int64 { return s.generation }

// Wrote reports whether a sink of this owner had written the target's
// tables (rows, a truncate, a DDL; since the last Reset) when this one
// started: a changefeed with a new slot empties such a target before its
// snapshot, since rows an earlier slot applied would survive it.
func (s *Sink) Wrote() bool { return s.wrote }

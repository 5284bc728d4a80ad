package pgsink

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/pgdial"
	"github.com/cdcflow/eventservice/internal/pglink"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventcollector"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

var _ eventcollector.AsyncSink = (*Sink)(nil)

// Sink applies changes to a PostgreSQL target. New validates; Start
// connects and prepares the checkpoint table; Bind each dispatcher to its
// table (before the collector registers it); Close stops.
//
// Lock order: startMu, then mu; adminMu, then mu or a lane's mu; mu and a
// lane's mu are never held together (each is a leaf: nothing is called
// under it that takes another lock, and no network wait happens under
// it). startMu and adminMu are held across network waits: Close never
// takes startMu (it cancels ctx, which ends Start's waits), and takes
// adminMu last, to close the admin connection, after an admin call in
// flight (under its caller's context) returned.
type Sink struct {
	opts Options
	log  *zap.Logger
	met  *metrics
	// lanes are set by Start, under mu, before mu.started; read-only
	// after. Read without mu only by a caller that saw mu.started (or
	// mu.closed: Close, which then sees every lane Start set up).
	lanes []*lane
	// link logs the target's outages once for every lane (pglink).
	link *pglink.Watch

	// ctx is the sink's lifetime: Close cancels it, which ends the lanes'
	// waits on the target and a Start's.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	durableFn func(id common.DispatcherID, epoch uint64, ts common.Ts)
	// leftFn reports whether a source table left the changefeed
	// (SetLeft); nil: none is known to have.
	leftFn func(oid uint32) bool
	// generation is the owner's generation this sink writes at (Start
	// sets it before mu.started; read-only after).
	generation int64
	// wrote: a sink of the owner had written the target's tables (since
	// the last Reset) when this one started (set like generation);
	// marked: the target's wrote marker is known to be set (fence.go).
	wrote  bool
	marked atomic.Bool
	// supersededCh is closed when mu.superseded is set.
	supersededCh chan struct{}
	// draining: Drain was called; checkpoint-only work is committed at
	// once, not every CheckpointInterval.
	draining atomic.Bool

	// knobs are set by tests (knobs.go); zero in production.
	knobs testingKnobs

	// startMu makes concurrent Starts run one at a time; held across
	// Start's waits on the target, which mu is not.
	startMu sync.Mutex

	// admin is the connection binds create and read tables on (one at a
	// time: a thousand tables must not cost a thousand connections);
	// under adminMu, held across its statements (adminConn).
	adminMu sync.Mutex
	admin   *pgx.Conn

	mu struct {
		sync.Mutex
		started, closed bool
		superseded      bool  // a later sink of the owner started (fence.go)
		notPermitted    error // why Options.Permit refused a write (fence.go)
		bound           map[common.DispatcherID]*binding
		durable         map[common.DispatcherID]common.Ts
		errs            map[common.DispatcherID]error
		stopped         map[common.DispatcherID]stoppedTable
		// released are stopped tables whose hold on the slot was let go
		// (Release): MinDurable leaves them out.
		released map[common.DispatcherID]bool
	}
}

// binding is a dispatcher's table and lane.
type binding struct {
	rel  pgcodec.Relation
	lane *lane
}

// New validates opts. It connects to nothing and starts nothing.
func New(opts Options) (*Sink, error) {
	opts = opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	s := &Sink{opts: opts, log: opts.Logger.Named("pgsink"), supersededCh: make(chan struct{})}
	s.link = pglink.NewWatch(s.log, "the target", opts.Clock.Now)
	s.mu.bound = map[common.DispatcherID]*binding{}
	s.mu.durable = map[common.DispatcherID]common.Ts{}
	s.mu.errs = map[common.DispatcherID]error{}
	s.mu.stopped = map[common.DispatcherID]stoppedTable{}
	s.mu.released = map[common.DispatcherID]bool{}
	var err error
	if s.met, err = newMetrics(s, opts.Registerer); err != nil {
		return nil, err
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// Start connects the lanes and creates the checkpoint table if missing.
// It holds no lock Close takes across its waits on the target (the
// connections; the fence's wait for an earlier sink's transactions, up to
// FenceWait): Close during Start cancels them and returns at once, and
// Start then returns ErrClosed. Concurrent Starts run one at a time.
func (s *Sink) Start(ctx context.Context) error {
	s.startMu.Lock()
	defer s.startMu.Unlock()
	s.mu.Lock()
	closed, started := s.mu.closed, s.mu.started
	s.mu.Unlock()
	if closed {
		return ErrClosed
	}
	if started {
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.ctx, cancel)() // Close ends the waits
	conns, err := s.connectLanes(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		for _, c := range conns {
			c.Close(context.Background())
		}
		return ErrClosed // whatever the waits ended with: Close cancelled them
	}
	if err != nil {
		return err
	}
	for i, c := range conns {
		s.lanes = append(s.lanes, newLane(s, i, c))
	}
	s.mu.started = true // after lanes, generation and wrote: read-only from here
	for _, l := range s.lanes {
		s.wg.Go(l.run)
	}
	return nil
}

// connectLanes is Start's work on the target: the cdcflow schema, the
// owner's fence (which sets generation, wrote and marked) and a
// connection per lane. REQUIRES: startMu held; not mu.
func (s *Sink) connectLanes(ctx context.Context) ([]*pgx.Conn, error) {
	conn, err := s.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConnect, err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, schemaSQL); err != nil {
		return nil, fmt.Errorf("%w: the cdcflow schema: %w", ErrConnect, err)
	}
	// Before anything is read or written: an earlier sink of the owner
	// may still have a transaction on its way to commit (fence.go).
	s.generation, s.wrote, err = acquireFence(ctx, conn, s.opts.Owner, s.opts.Source, s.opts.FenceWait, s.opts.SoleOwner)
	if errors.Is(err, errFenceHeld) && s.opts.EndFenceHolders {
		ended, endErr := endFenceHolders(ctx, conn, s.opts.Owner)
		if endErr == nil && len(ended) > 0 {
			s.log.Warn("ended the target backends an earlier sink of the owner left in a transaction holding its fence",
				zap.String("owner", s.opts.Owner), zap.Int32s("pids", ended), zap.Duration("after", s.opts.FenceWait))
			s.generation, s.wrote, err = acquireFence(ctx, conn, s.opts.Owner, s.opts.Source, s.opts.FenceWait, s.opts.SoleOwner)
		}
	}
	if err != nil {
		if errors.Is(err, ErrAnotherOwner) || errors.Is(err, ErrOtherSource) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: fence owner %q: %w", ErrConnect, s.opts.Owner, err)
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
		return nil, fmt.Errorf("%w: lanes: %w", ErrConnect, err)
	}
	return conns, nil
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
func (s *Sink) connect(ctx context.Context) (*pgx.Conn, error) { return Connect(ctx, s.opts.DSN) }

// Connect opens a connection to the target at dsn as the sink's own are
// (its text formats, keepalives and timeouts): for what reads the target
// beside a sink (a start's checks, status).
func Connect(ctx context.Context, dsn string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(dsn)
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

// Connected reports whether every lane's connection to the target is
// open (for a readiness check).
func (s *Sink) Connected() bool {
	lanes := s.startedLanes()
	for _, l := range lanes {
		if !l.app.connected() {
			return false
		}
	}
	return len(lanes) > 0
}

// startedLanes returns the lanes once Start set them up, nil before (a
// metrics scrape may ask while Start runs).
func (s *Sink) startedLanes() []*lane {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.mu.started {
		return nil
	}
	return s.lanes
}

// Drain prepares a clean stop: from now on a dispatcher's checkpoint is
// committed as soon as its lane takes it, rows or not (CheckpointInterval
// no longer holds an idle table's back), so that every table's durable
// checkpoint can reach the source's last commit before the process exits
// (pgsource.Source.Quiesce waits for that).
func (s *Sink) Drain() {
	s.draining.Store(true)
	for _, l := range s.startedLanes() {
		l.mu.Lock()
		l.ringLocked()
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
		l.app.conn.Close(context.Background()) // the lane goroutines are done with them
	}
	s.adminMu.Lock()
	if s.admin != nil {
		s.admin.Close(context.Background())
	}
	s.adminMu.Unlock()
	s.met.unregister()
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

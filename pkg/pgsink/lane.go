package pgsink

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/backoff"
	"github.com/cdcflow/eventservice/pkg/common"
)

type opKind uint8

const (
	opBegin opKind = iota + 1
	opRows
	opDDL
	opCheckpoint
)

// op is one queued sink call.
type op struct {
	kind  opKind
	id    common.DispatcherID
	epoch uint64
	ts    common.Ts
	rows  []common.Row
	ddl   string
}

type durableMark struct {
	id    common.DispatcherID
	epoch uint64
	ts    common.Ts
}

// dstate is a dispatcher as its lane applies it.
type dstate struct {
	id    common.DispatcherID
	hexID string // id as cdcflow.checkpoints keys it
	table *table
	epoch uint64
	work  []op // since the last commit, in call order
	rows  bool // work holds rows or a DDL, not only checkpoints
	held  bool // in the lane's held list
	// written is when the dispatcher's checkpoint was last committed.
	written  time.Time
	failures int
	// broken: its work failed; what follows is dropped until the reset's
	// BeginEpoch (the stream sends it all again from the checkpoint).
	broken bool
}

// dropWork empties d's work for reuse: the ops' rows are let go, the
// list's room is kept (a dispatcher's work grew from nothing after every
// commit, a few allocations a commit per table in a drain).
func (d *dstate) dropWork() []op {
	clear(d.work)
	return d.work[:0]
}

// lane applies the dispatchers hashed to it, on its own connection.
type lane struct {
	s    *Sink
	n    int
	conn *pgx.Conn // the lane goroutine's (and bind's, before it runs)
	down atomic.Bool

	// wake (capacity one) tells the lane goroutine work was queued or the
	// lane closed; it is rung after the change, under mu.
	wake chan struct{}

	mu     sync.Mutex
	cond   *sync.Cond // enqueuers waiting for room: signalled on dequeue and close
	queue  []op
	spare  []op // the queue take emptied last, for the next (a drain grew a new one at every take)
	qrows  int
	closed bool
	// warm are the tables still to warm (warm.go), warmed how many were
	// ever queued; under mu.
	warm    []*table
	warmed  int
	tables  map[uint32]*table               // under mu
	states  map[common.DispatcherID]*dstate // under mu; a dstate's fields are the lane goroutine's
	pending int                             // rows in the dstates' work; the lane goroutine's
	// held lists the dstates that have (or had, since the last review)
	// work, each once: a commit and its review walk them, not every
	// dispatcher of the lane. The lane goroutine's.
	held []*dstate
	// ckptDue is when the earliest held checkpoint-only work is due
	// (zero: none held); the lane goroutine's.
	ckptDue time.Time
	// newest is the largest commit-ts of the rows taken since the last
	// commit (zero: none), for flushInterval; the lane goroutine's.
	newest common.Ts
	// arrived is when rows were last taken; the lane goroutine's.
	arrived time.Time

	// What the lane goroutine sends with (pipeline.go): the pipeline a
	// commit builds (reused), the statements every commit may carry, the
	// owner as a parameter, how many connections the lane has had (a
	// statement is prepared on the one its conn names) and how many
	// statements it has named.
	pipe                          pipeline
	batch                         batch // queueWork's, for one table at a time
	fence, markWrote, checkpoints stmt
	owner                         []byte
	connections, named            uint64
}

func newLane(s *Sink, n int, conn *pgx.Conn) *lane {
	l := &lane{s: s, n: n, conn: conn, tables: map[uint32]*table{}, states: map[common.DispatcherID]*dstate{},
		fence: stmt{sql: fenceSQL}, markWrote: stmt{sql: markWroteSQL}, checkpoints: stmt{sql: checkpointSQL},
		owner: []byte(s.opts.Owner), connections: 1}
	l.cond = sync.NewCond(&l.mu)
	l.wake = make(chan struct{}, 1)
	return l
}

// attach gives the lane dispatcher id of table t (loaded by the sink);
// the first dispatcher of a table brings its table.
func (l *lane) attach(id common.DispatcherID, t *table) *table {
	l.mu.Lock()
	defer l.mu.Unlock()
	if have := l.tables[t.rel.OID]; have != nil {
		t = have
	} else {
		l.tables[t.rel.OID] = t
	}
	if l.states[id] == nil {
		l.states[id] = &dstate{id: id, hexID: hexID(id), table: t}
	}
	return t
}

// has reports whether the lane knows table oid.
func (l *lane) has(oid uint32) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.tables[oid] != nil
}

// enqueue queues o, waiting while the lane holds QueueRows rows.
func (l *lane) enqueue(o op) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for !l.closed && len(o.rows) > 0 && l.qrows > 0 && l.qrows+len(o.rows) > l.s.opts.QueueRows {
		if k := l.s.knobs.enqueueWaits; k != nil {
			k()
		}
		l.cond.Wait()
	}
	if l.closed {
		return ErrClosed
	}
	l.queue = append(l.queue, o)
	l.qrows += len(o.rows)
	l.ring()
	return nil
}

func (l *lane) close() {
	l.mu.Lock()
	l.closed = true
	l.cond.Broadcast()
	l.ring()
	l.mu.Unlock()
}

func (l *lane) ring() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// take waits for queued work (or the deadline, on the sink's clock; with
// a zero deadline, for work only; with canWarm, not while tables are left
// to warm) and moves it into the dispatchers' work lists. It reports false
// once the lane is closed.
func (l *lane) take(deadline time.Time, canWarm bool) bool {
	clk := l.s.opts.Clock
	for {
		l.mu.Lock()
		if len(l.queue) > 0 || l.closed || l.s.draining.Load() && !l.ckptDue.IsZero() || canWarm && len(l.warm) > 0 {
			break // (draining: held checkpoints are due now; see Sink.Drain)
		}
		l.mu.Unlock()
		if deadline.IsZero() {
			<-l.wake
			continue
		}
		wait := deadline.Sub(clk.Now())
		if wait <= 0 {
			l.mu.Lock()
			break
		}
		t := clk.NewTimer(wait)
		select {
		case <-l.wake:
			t.Stop()
			continue
		case <-t.C():
		}
		l.mu.Lock()
		break
	}
	defer l.mu.Unlock()
	q := l.queue
	l.queue, l.qrows = l.spare, 0
	defer func() { clear(q); l.spare = q[:0] }() // before the unlock (defers run last first)
	closed := l.closed
	l.cond.Broadcast()
	// The states map is shared with attach (a table added while running),
	// so it is read under mu; a dstate's fields are the lane goroutine's.
	took := false // rows: arrived is now (read once, not per op: 2% of a drain)
	for _, o := range q {
		d := l.states[o.id]
		if d == nil {
			continue
		}
		if o.kind == opBegin {
			// A new epoch: what was queued for the dispatcher and not
			// committed is gone; the stream sends it again.
			for _, w := range d.work {
				l.pending -= len(w.rows)
			}
			d.work, d.rows, d.epoch, d.broken = d.dropWork(), false, o.epoch, false
			continue
		}
		if d.broken {
			continue
		}
		if o.kind == opCheckpoint && len(d.work) > 0 && d.work[len(d.work)-1].kind == opCheckpoint {
			d.work[len(d.work)-1] = o // a later checkpoint replaces one nothing follows
		} else {
			d.work = append(d.work, o)
		}
		d.rows = d.rows || o.kind != opCheckpoint
		if n := len(o.rows); n > 0 {
			l.newest = max(l.newest, o.rows[n-1].CommitTs)
			took = true
		}
		if !d.rows {
			l.noteCheckpoint(d)
		}
		if !d.held {
			d.held = true
			l.held = append(l.held, d)
		}
		l.pending += len(o.rows)
	}
	if took {
		l.arrived = clk.Now()
	}
	return !closed
}

// run applies queued work in transactions until Close: when it holds
// BatchRows rows, or FlushInterval after the last commit if it holds rows,
// or when a dispatcher's checkpoint-only work is due (CheckpointInterval
// after its last write). With nothing held it waits for work, no timer
// running.
func (l *lane) run() {
	clk := l.s.opts.Clock
	last := clk.Now()
	for {
		var deadline time.Time
		if l.pending > 0 {
			deadline = l.rowsDeadline(last)
		}
		if !l.ckptDue.IsZero() && (deadline.IsZero() || l.ckptDue.Before(deadline)) {
			deadline = l.ckptDue
		}
		// With tables to warm and no commit due soon, take returns at once
		// (warm.go).
		canWarm := deadline.IsZero() || deadline.Sub(clk.Now()) >= warmMargin
		if !l.take(deadline, canWarm) {
			return
		}
		now := clk.Now()
		rowsDue := l.pending >= l.s.opts.BatchRows || l.pending > 0 && !now.Before(l.rowsDeadline(last))
		ckptsDue := !l.ckptDue.IsZero() && (!now.Before(l.ckptDue) || l.s.draining.Load())
		if !rowsDue && !ckptsDue {
			l.warmSome(now, deadline) // while nothing is due
			continue
		}
		l.commitAll(now)
		l.reviewWork() // work a failed or lost commit kept, checkpoints not yet due
		last, l.newest = now, 0
	}
}

// rowsDeadline is when the rows held are due: flushInterval after the last
// commit, but, while that is stretched, no later than FlushInterval after
// rows last arrived: a backlog that stops arriving (its end, a fence a
// benchmark waits for) is committed at once instead of waiting out the
// stretch, which only pays while rows keep coming.
func (l *lane) rowsDeadline(last time.Time) time.Time {
	due := last.Add(l.flushInterval(last))
	if quiet := l.arrived.Add(l.s.opts.FlushInterval); quiet.Before(due) {
		due = quiet
	}
	return due
}

// flushInterval is FlushInterval, or MaxFlushInterval while the rows held
// are far behind: the newest of them more than four MaxFlushIntervals
// behind the source at the last commit (a backlog, a restart). A backlog
// then goes in larger statements: at 1000 tables a 100 ms cadence gave each
// table's statement three or four rows, and the target spent about half its
// CPU per statement, not per row. The threshold is far above the lag of a
// changefeed that keeps up, which a stretched cadence would add to (a
// graded stretch from 400 ms of lag raised the lag p99 at 1000 tables from
// 0.4 s to 0.9 s). The lag is the one at the last commit, a fixed point: a
// lag taken at every wake-up grows while the lane waits.
func (l *lane) flushInterval(last time.Time) time.Duration {
	if maxi := l.s.opts.MaxFlushInterval; l.newest != 0 && l.newest.Lag(last) > 4*maxi {
		return maxi
	}
	return l.s.opts.FlushInterval
}

// noteCheckpoint records that d holds checkpoint-only work, due
// CheckpointInterval after its last write (at once if never written).
func (l *lane) noteCheckpoint(d *dstate) {
	due := d.written.Add(l.s.opts.CheckpointInterval)
	if d.written.IsZero() {
		due = l.s.opts.Clock.Now()
	}
	if l.ckptDue.IsZero() || due.Before(l.ckptDue) {
		l.ckptDue = due
	}
}

// reviewWork drops the dstates without work from held and recomputes
// ckptDue, after a commit.
func (l *lane) reviewWork() {
	l.ckptDue = time.Time{}
	kept := l.held[:0]
	for _, d := range l.held {
		if len(d.work) == 0 {
			d.held = false
			continue
		}
		kept = append(kept, d)
		if !d.rows {
			l.noteCheckpoint(d)
		}
	}
	clear(l.held[len(kept):])
	l.held = kept
}

// commitAll applies the dispatchers' work in one transaction; if the
// target refuses it, each dispatcher's work alone, so one bad table does
// not hold the others. A dispatcher with rows is always in it, its
// checkpoint with them (a restart resumes exactly after them); one whose
// work is checkpoints only once its checkpoint was last written
// CheckpointInterval ago (or never): an idle table's resolved-ts advances
// every 100 ms or so, and writing each at every commit was a checkpoint
// row per idle table per commit, more writes than the rows (1000 tables).
func (l *lane) commitAll(now time.Time) {
	if l.s.Err() != nil {
		l.dropHeld() // superseded: nothing is written any more
		return
	}
	var ds []*dstate
	draining := l.s.draining.Load()
	for _, d := range l.held {
		if len(d.work) > 0 && (d.rows || draining || d.written.IsZero() || now.Sub(d.written) >= l.s.opts.CheckpointInterval) {
			ds = append(ds, d)
		}
	}
	if len(ds) == 0 {
		return
	}
	err := l.commit(ds)
	if err == nil {
		l.s.met.commitSeconds.Observe(l.s.opts.Clock.Now().Sub(now).Seconds())
		return
	}
	if l.s.ctx.Err() != nil {
		return
	}
	if isSuperseded(err) {
		l.s.supersede()
		l.dropHeld()
		return
	}
	if l.lost(err) {
		// The target is down or the connection broke: nothing is any
		// table's fault. Keep the work, connect again and retry; the
		// queue fills meanwhile, which is the back-pressure.
		l.loseTarget(err)
		return
	}
	l.s.log.Warn("a lane's transaction failed; applying its tables one by one", zap.Int("lane", l.n), zap.Error(err))
	for _, d := range ds {
		if err := l.commit([]*dstate{d}); err != nil && l.s.ctx.Err() == nil {
			if isSuperseded(err) {
				l.s.supersede()
				l.dropHeld()
				return
			}
			if l.lost(err) {
				l.loseTarget(err)
				return
			}
			d.failures++
			stop := errors.Is(err, ErrSchemaChange) || d.failures >= l.s.opts.MaxFailures
			l.s.failed(d.id, err, stop)
			for _, w := range d.work {
				l.pending -= len(w.rows)
			}
			d.work, d.rows, d.broken = d.dropWork(), false, true
		}
	}
}

// dropHeld drops the work of every dispatcher the lane holds: the sink
// was superseded and writes nothing more.
func (l *lane) dropHeld() {
	for _, d := range l.held {
		d.work, d.rows = d.dropWork(), false
	}
	l.pending = 0
}

// lost reports whether err is the connection's fault, not the data's: the
// connection closed, or an error the server did not send, or one of its
// connection and shutdown classes (08, 57P).
func (l *lane) lost(err error) bool {
	if errors.Is(err, ErrSchemaChange) || errors.Is(err, errBadData) {
		return false // the data's, found before the server saw it
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		// Not 08P01 (protocol violation): the server says that of a Bind
		// whose parameters do not match the statement, which sent again
		// would fail again; if the server also closed the connection, the
		// next use fails without a server error, and that is lost.
		return strings.HasPrefix(pe.Code, "08") && pe.Code != "08P01" || strings.HasPrefix(pe.Code, "57P")
	}
	return true
}

// loseTarget is the one way a lane handles a lost connection (a commit's,
// a table's alone, a warm-up's): down, counted, the sink's outage
// reported once for all its lanes (Sink.link), connected again.
func (l *lane) loseTarget(err error) {
	l.down.Store(true)
	l.s.met.reconnects.Inc()
	l.s.link.Down(err, zap.Int("lane", l.n))
	l.reconnect()
}

// reconnect replaces the lane's connection, retrying with a doubling
// delay (50ms to 2s, shortened by up to 20% at random: the lanes that lost
// the target together do not all try again together) until it succeeds or
// the sink closes.
func (l *lane) reconnect() {
	pause := backoff.Backoff{Base: 50 * time.Millisecond, Max: 2 * time.Second, Jitter: 0.2}
	for l.s.ctx.Err() == nil {
		_ = l.conn.Close(context.Background())
		conn, err := l.s.connect(l.s.ctx)
		if err == nil {
			l.conn = conn
			l.connections++ // what was prepared on the old one is not on this one
			l.down.Store(false)
			l.s.link.Up()
			return
		}
		l.s.link.Down(err, zap.Int("lane", l.n))
		t := l.s.opts.Clock.NewTimer(pause.Next())
		select {
		case <-l.s.ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

// connected reports whether the lane's connection was working when it
// was last used (a pgx connection may not be asked from another
// goroutine).
func (l *lane) connected() bool { return !l.down.Load() }

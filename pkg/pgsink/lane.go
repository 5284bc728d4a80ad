package pgsink

import (
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/common"
)

// lane applies the dispatchers hashed to it, on its own connection. The
// sink's calls queue work (enqueue); the lane goroutine (run) takes it
// into its flush policy (policy.go: pure, what is due when), waits for
// what the policy says is due and commits it through its applier
// (applier.go: the I/O), or warms its tables meanwhile (warm.go).
//
// Locking: mu guards what the sink's calls and binds share with the lane
// goroutine; it is a leaf (see Sink's lock order): nothing under it takes
// another lock or waits on the target (the enqueueWaits knob runs under
// it). pol, app and every dstate's fields are the lane goroutine's alone
// (a dstate is created by attach under mu, where the goroutine finds it;
// app.down is atomic, for Connected).
type lane struct {
	s *Sink
	n int
	// wake (capacity one) tells the lane goroutine work was queued or the
	// lane closed; it is rung after the change, under mu (ringLocked).
	wake chan struct{}

	// pol is the lane goroutine's (run sets it up), app too (Start's
	// connection until the first reconnect).
	pol policy
	app applier

	mu struct {
		sync.Mutex
		// room is signalled on dequeue, on a commit (or drop) of held
		// work and on close: enqueuers wait on it while the queue holds
		// QueueRows rows or the lane holds its share of QueueBytes.
		room  sync.Cond
		queue []op
		spare []op // the queue take emptied last, for the next (a drain grew a new one at every take)
		qrows int
		// qbytes are the queue's bytes (op.bytes), hbytes those the
		// policy holds, taken and not yet committed (its pendingBytes,
		// as of the lane goroutine's last take or commit round): the
		// lane's share of QueueBytes bounds their sum.
		qbytes, hbytes int64
		// closed: Close was called; enqueue refuses, run returns.
		closed bool
		// warm are the tables still to warm (warm.go), warmed how many
		// were ever queued.
		warm   []*table
		warmed int
		tables map[uint32]*table
		states map[common.DispatcherID]*dstate
	}
}

func newLane(s *Sink, n int, conn *pgx.Conn) *lane {
	l := &lane{s: s, n: n, wake: make(chan struct{}, 1), app: newApplier(s, n, conn)}
	l.mu.room.L = &l.mu.Mutex
	l.mu.tables = map[uint32]*table{}
	l.mu.states = map[common.DispatcherID]*dstate{}
	return l
}

// attach gives the lane dispatcher id of table t (loaded by the sink);
// the first dispatcher of a table brings its table.
func (l *lane) attach(id common.DispatcherID, t *table) *table {
	l.mu.Lock()
	defer l.mu.Unlock()
	if have := l.mu.tables[t.rel.OID]; have != nil {
		t = have
	} else {
		l.mu.tables[t.rel.OID] = t
	}
	if l.mu.states[id] == nil {
		l.mu.states[id] = &dstate{id: id, hexID: hexID(id), table: t}
	}
	return t
}

// has reports whether the lane knows table oid.
func (l *lane) has(oid uint32) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.tables[oid] != nil
}

// enqueue queues o, waiting while the lane's queue holds QueueRows rows
// or the lane holds its share of QueueBytes (fullLocked). o's bytes are
// counted before mu.
func (l *lane) enqueue(o op) error {
	o.bytes = opBytes(o)
	l.mu.Lock()
	defer l.mu.Unlock()
	for !l.mu.closed && l.fullLocked(o) {
		if k := l.s.knobs.enqueueWaits; k != nil {
			k()
		}
		l.mu.room.Wait()
	}
	if l.mu.closed {
		return ErrClosed
	}
	l.mu.queue = append(l.mu.queue, o)
	l.mu.qrows += len(o.rows)
	l.mu.qbytes += o.bytes
	l.ringLocked()
	return nil
}

// fullLocked reports whether o must wait for room: its rows would take
// the queue beyond QueueRows, or its bytes the lane beyond its share of
// QueueBytes. An op goes in alone whatever its size: into an empty queue
// as far as rows go, into a lane that holds nothing as far as bytes go
// (the room it waits for is then that of work queued or held before it,
// whose commit falls due without it: by BatchRows, half the share, or
// the flush interval). REQUIRES: l.mu held.
func (l *lane) fullLocked(o op) bool {
	if len(o.rows) > 0 && l.mu.qrows > 0 && l.mu.qrows+len(o.rows) > l.s.opts.QueueRows {
		return true
	}
	held := l.mu.qbytes + l.mu.hbytes
	return o.bytes > 0 && held > 0 && held+o.bytes > l.s.opts.laneBytes()
}

// released records, after a commit round, that the policy holds fewer
// bytes (committed or dropped), and wakes the calls waiting for room.
// The lane goroutine's (it reads pol).
func (l *lane) released() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pol.pendingBytes < l.mu.hbytes {
		l.mu.hbytes = l.pol.pendingBytes
		l.mu.room.Broadcast()
	}
}

func (l *lane) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mu.closed = true
	l.mu.room.Broadcast()
	l.ringLocked()
}

// ringLocked wakes the lane goroutine. REQUIRES: l.mu held (after the
// change it is to see).
func (l *lane) ringLocked() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// run applies queued work in transactions until Close, as the policy says
// (policy.go): it waits until a commit is due or work arrives, takes the
// work, and commits what is due, or warms while nothing is. With nothing
// held it waits for work, no timer running.
func (l *lane) run() {
	clk := l.s.opts.Clock
	l.pol = newPolicy(l.s.opts, clk.Now()) // the start counts as the last commit
	for {
		deadline := l.pol.deadline()
		// With tables to warm and no commit due soon, take returns at once
		// (warm.go).
		if !l.take(deadline, warmAllowed(deadline, clk.Now())) {
			return
		}
		now := clk.Now()
		draining := l.s.draining.Load()
		if !l.pol.due(now, draining) {
			l.warmSome(now, deadline) // while nothing is due
			l.released()              // a warm-up the fence refused dropped the work held
			continue
		}
		l.commitAll(now, draining)
		l.pol.endRound(now, clk.Now())
		l.released()
	}
}

// take waits for queued work (or the deadline, on the sink's clock; with
// a zero deadline, for work only; with canWarm, not while tables are left
// to warm) and folds it into the policy. It reports false once the lane
// is closed.
func (l *lane) take(deadline time.Time, canWarm bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.waitLocked(deadline, canWarm)
	q := l.mu.queue
	l.mu.queue, l.mu.qrows, l.mu.qbytes = l.mu.spare, 0, 0
	l.mu.room.Broadcast()
	// The states map is shared with attach (a table added while running),
	// so it is read under mu; a dstate's fields are the lane goroutine's.
	now := l.s.opts.Clock.Now()
	for _, o := range q {
		if d := l.mu.states[o.id]; d != nil {
			l.pol.add(d, o, now)
		}
	}
	// What the policy kept (a broken dispatcher's work is dropped, a new
	// epoch drops what it held) still counts against QueueBytes.
	l.mu.hbytes = l.pol.pendingBytes
	clear(q)
	l.mu.spare = q[:0]
	return !l.mu.closed
}

// waitLocked waits, mu released meanwhile, until there is something to
// take (readyLocked) or deadline passed (zero: none). REQUIRES: l.mu
// held; it is held again on return.
func (l *lane) waitLocked(deadline time.Time, canWarm bool) {
	clk := l.s.opts.Clock
	for !l.readyLocked(canWarm) {
		l.mu.Unlock()
		passed := false
		if deadline.IsZero() {
			<-l.wake
		} else if wait := deadline.Sub(clk.Now()); wait <= 0 {
			passed = true
		} else {
			t := clk.NewTimer(wait)
			select {
			case <-l.wake:
				t.Stop()
			case <-t.C():
				passed = true
			}
		}
		l.mu.Lock()
		if passed {
			return
		}
	}
}

// readyLocked reports whether the lane goroutine has something to take
// or do at once: work queued, the lane closed, held checkpoints due now
// (draining: see Sink.Drain), or, with canWarm, tables to warm.
// REQUIRES: l.mu held.
func (l *lane) readyLocked(canWarm bool) bool {
	return len(l.mu.queue) > 0 || l.mu.closed || l.pol.drainDue(l.s.draining.Load()) || canWarm && len(l.mu.warm) > 0
}

// commitAll commits what the policy says is due at now, in one
// transaction; if the target refuses it for some table's data, each
// dispatcher's work alone, so one bad table does not hold the others.
func (l *lane) commitAll(now time.Time, draining bool) {
	if l.s.Err() != nil {
		l.pol.dropAll() // superseded: nothing is written any more
		return
	}
	ds := l.pol.pick(now, draining)
	if len(ds) == 0 {
		return
	}
	switch f, err := l.apply(ds); f {
	case failNone:
		l.s.met.commitSeconds.Observe(l.s.opts.Clock.Now().Sub(now).Seconds())
		return
	case failTable:
		l.s.log.Warn("a lane's transaction failed; applying its tables one by one", zap.Int("lane", l.n), zap.Error(err))
	default:
		return // apply carried it out
	}
	for _, d := range ds {
		switch f, err := l.apply([]*dstate{d}); f {
		case failTable:
			l.s.failed(d.id, err, l.pol.failed(d, errors.Is(err, ErrSchemaChange)))
		case failSuperseded, failLost:
			return
		}
	}
}

// apply commits ds in one transaction, the one path of a commit of many
// tables and of a table's own retry: once committed, the policy and the
// collector hear of it; if not, the error is classified once (classify)
// and what it calls for carried out (settle), but for the table's own
// fault (failTable), which is the caller's.
func (l *lane) apply(ds []*dstate) (failure, error) {
	marks, applied, err := l.app.commit(ds)
	if err == nil {
		l.pol.committed(ds, l.s.opts.Clock.Now())
		l.s.met.rows.Add(float64(applied))
		l.s.met.commits.Inc()
		l.s.committed(marks)
		return failNone, nil
	}
	f := classify(l.s.ctx.Err() != nil, err)
	l.settle(f, err)
	return f, err
}

// settle carries out what a failed commit or warm-up calls for: a
// superseded sink writes nothing more (its held work dropped); a lost
// target is connected to again (the work kept). Closing, and a table's
// own fault, are the caller's.
func (l *lane) settle(f failure, err error) {
	switch f {
	case failSuperseded:
		l.s.supersede()
		l.pol.dropAll()
	case failLost:
		l.app.loseTarget(err)
	}
}

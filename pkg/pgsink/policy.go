package pgsink

import (
	"time"

	"github.com/cdcflow/eventservice/pkg/common"
)

// A lane's flush policy: the work the lane holds, per dispatcher, and what
// is due when. It is pure: the time comes in as an argument, and nothing
// here locks, reads a clock or touches the target. The lane (lane.go)
// waits, takes and commits as it says; the applier (applier.go) does the
// I/O. testdata/policy traces it (TestPolicyTrace).
//
// What it decides:
//   - a dispatcher with rows (or a DDL) is committed with them: when the
//     lane holds BatchRows rows or half its share of QueueBytes (the rows
//     it holds count against the share until they commit: so that they
//     do not pin it, a commit falls due well before they fill it), or
//     FlushInterval after the lane's last
//     commit (MaxFlushInterval while the rows are far behind, but no later
//     than FlushInterval after rows last arrived: rowsDeadline);
//   - one whose work is checkpoints only is committed CheckpointInterval
//     after its checkpoint was last written (at once if never), and with
//     the next commit after that; at once while the sink drains;
//   - a lane with no commit due within warmMargin may warm (warmAllowed);
//   - a table whose commit the target refused MaxFailures times in a row
//     stops (at once for a schema change), and its work is dropped until
//     the reset's BeginEpoch.

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
	// bytes is what the op holds in memory (opBytes), counted once by
	// enqueue, before the lane's mu.
	bytes int64
}

// rowOverhead is what a row costs beyond its key's and values' bytes: a
// common.Row (its op, three slice headers, two timestamps), 96 bytes on a
// 64-bit platform (TestRowOverheadIsARowsSize).
const rowOverhead = 96

// opBytes is what o holds in memory, as QueueBytes counts it: its rows'
// keys and values plus rowOverhead each, and a DDL's text.
func opBytes(o op) int64 {
	n := int64(len(o.ddl))
	for i := range o.rows {
		n += int64(o.rows[i].Size()) + rowOverhead
	}
	return n
}

// dstate is a dispatcher as its lane applies it. Its fields are the lane
// goroutine's (attach creates it under the lane's mu, where the goroutine
// finds it).
type dstate struct {
	id    common.DispatcherID
	hexID string // id as cdcflow.checkpoints keys it
	table *table
	epoch uint64
	work  []op // since the last commit, in call order
	rows  bool // work holds rows or a DDL, not only checkpoints
	held  bool // in the policy's held list
	// written is when the dispatcher's checkpoint was last committed.
	written  time.Time
	failures int
	// broken: its work failed; what follows is dropped until the reset's
	// BeginEpoch (the stream sends it all again from the checkpoint).
	broken bool
	// applied is the position of the table's last row committed
	// (applied.go), appliedNext of the last one queued in the commit
	// being built.
	applied, appliedNext appliedPos
	// dropped: the source table was dropped and its target table with it
	// (droppedNext: in the commit being built).
	dropped, droppedNext bool
}

// dropWork empties d's work for reuse: the ops' rows are let go, the
// list's room is kept (a dispatcher's work grew from nothing after every
// commit, a few allocations a commit per table in a drain).
func (d *dstate) dropWork() []op {
	clear(d.work)
	return d.work[:0]
}

// policy is a lane's flush policy (see above). The lane goroutine owns
// it.
type policy struct {
	cfg policyConfig
	// pending is the number of rows (and DDLs) in the held dstates' work,
	// pendingBytes their bytes (op.bytes).
	pending      int
	pendingBytes int64
	// held lists the dstates that have (or had, since the last review)
	// work, each once: a commit and its review walk them, not every
	// dispatcher of the lane.
	held []*dstate
	// ckptDue is when the earliest held checkpoint-only work is due
	// (zero: none held).
	ckptDue time.Time
	// newest is the largest commit-ts of the rows taken since the last
	// commit (zero: none), for flushInterval.
	newest common.Ts
	// arrived is when rows were last taken.
	arrived time.Time
	// last is when the last commit round started (the lane's start
	// before the first).
	last time.Time
}

// policyConfig is what a policy applies, from Options.
type policyConfig struct {
	flush, maxFlush, checkpoint time.Duration
	batchRows, maxFailures      int
	// batchBytes: a commit is due once the work held is this large (half
	// the lane's share of QueueBytes; zero: never by bytes).
	batchBytes int64
}

// newPolicy is a lane's policy, started at start (as if it had committed
// then).
func newPolicy(o Options, start time.Time) policy {
	return policy{last: start, cfg: policyConfig{flush: o.FlushInterval, maxFlush: o.MaxFlushInterval,
		checkpoint: o.CheckpointInterval, batchRows: o.BatchRows, maxFailures: o.MaxFailures,
		batchBytes: o.laneBytes() / 2}}
}

// add folds o, taken at now, into d's work, in call order. A new epoch
// drops what d held and did not commit (the stream sends it again) and
// mends a broken d; a broken d's work is dropped; a checkpoint replaces
// one nothing follows.
func (p *policy) add(d *dstate, o op, now time.Time) {
	if o.kind == opBegin {
		p.drop(d)
		d.epoch, d.broken = o.epoch, false
		return
	}
	if d.broken {
		return
	}
	if o.kind == opCheckpoint && len(d.work) > 0 && d.work[len(d.work)-1].kind == opCheckpoint {
		d.work[len(d.work)-1] = o
	} else {
		d.work = append(d.work, o)
	}
	d.rows = d.rows || o.kind != opCheckpoint
	if n := len(o.rows); n > 0 {
		p.newest = max(p.newest, o.rows[n-1].CommitTs)
		p.arrived = now
	} else if o.kind == opDDL {
		p.arrived = now
	}
	if !d.rows {
		p.noteCheckpoint(d, now)
	}
	if !d.held {
		d.held = true
		p.held = append(p.held, d)
	}
	p.pending += weight(o)
	p.pendingBytes += o.bytes
}

// weight is what o counts in pending: its rows, and one for a DDL, which
// is work to commit even with no row after it (a table dropped).
func weight(o op) int {
	if o.kind == opDDL {
		return len(o.rows) + 1
	}
	return len(o.rows)
}

// drop empties d's work.
func (p *policy) drop(d *dstate) {
	for _, w := range d.work {
		p.pending -= weight(w)
		p.pendingBytes -= w.bytes
	}
	d.work, d.rows = d.dropWork(), false
}

// deadline is when the next commit falls due: the rows' deadline or the
// earliest checkpoint's. Zero: nothing held, nothing due.
func (p *policy) deadline() time.Time {
	var deadline time.Time
	if p.pending > 0 {
		deadline = p.rowsDeadline()
	}
	if !p.ckptDue.IsZero() && (deadline.IsZero() || p.ckptDue.Before(deadline)) {
		deadline = p.ckptDue
	}
	return deadline
}

// due reports whether a commit is due at now: BatchRows rows held, or
// batchBytes, the rows' deadline passed, or a checkpoint's (any held
// checkpoint, while draining).
func (p *policy) due(now time.Time, draining bool) bool {
	full := p.pending >= p.cfg.batchRows || p.cfg.batchBytes > 0 && p.pendingBytes >= p.cfg.batchBytes
	rowsDue := full || p.pending > 0 && !now.Before(p.rowsDeadline())
	return rowsDue || p.drainDue(draining) || !p.ckptDue.IsZero() && !now.Before(p.ckptDue)
}

// drainDue reports whether the sink drains and checkpoint-only work is
// held: due now, whatever its deadline (Sink.Drain). A lane waiting to
// take work stops waiting for it.
func (p *policy) drainDue(draining bool) bool { return draining && !p.ckptDue.IsZero() }

// warmAllowed reports whether a lane may start a warm-up at now: no
// commit due within warmMargin of it (deadline; zero: none due). A commit
// falls due during one warm-up pipeline at most, and waits for its end.
func warmAllowed(deadline, now time.Time) bool {
	return deadline.IsZero() || deadline.Sub(now) >= warmMargin
}

// rowsDeadline is when the rows held are due: flushInterval after the last
// commit, but, while that is stretched, no later than FlushInterval after
// rows last arrived: a backlog that stops arriving (its end, a fence a
// benchmark waits for) is committed at once instead of waiting out the
// stretch, which only pays while rows keep coming.
func (p *policy) rowsDeadline() time.Time {
	due := p.last.Add(p.flushInterval())
	if quiet := p.arrived.Add(p.cfg.flush); quiet.Before(due) {
		due = quiet
	}
	return due
}

// flushInterval is FlushInterval, or MaxFlushInterval while the rows held
// are far behind: the newest of them more than four MaxFlushIntervals
// behind the source at the last commit (a backlog, a restart). A backlog
// then goes in larger statements, spreading the target's cost per
// statement over more rows. The threshold is far above the lag of a
// changefeed that keeps up, which a stretched cadence would add to. The
// lag is the one at the last commit, a fixed point: a lag taken at every
// wake-up grows while the lane waits.
func (p *policy) flushInterval() time.Duration {
	if maxi := p.cfg.maxFlush; p.newest != 0 && p.newest.Lag(p.last) > 4*maxi {
		return maxi
	}
	return p.cfg.flush
}

// noteCheckpoint records that d holds checkpoint-only work, due
// CheckpointInterval after its last write (at now if never written).
func (p *policy) noteCheckpoint(d *dstate, now time.Time) {
	due := d.written.Add(p.cfg.checkpoint)
	if d.written.IsZero() {
		due = now
	}
	if p.ckptDue.IsZero() || due.Before(p.ckptDue) {
		p.ckptDue = due
	}
}

// pick returns the dispatchers a commit at now takes, in the order their
// work arrived: every one with rows, its checkpoint with them (a restart
// resumes exactly after them); one whose work is checkpoints only once its
// checkpoint was last written CheckpointInterval ago (or never), or while
// draining. An idle table's resolved-ts advances every 100 ms or so, and
// writing each at every commit was a checkpoint row per idle table per
// commit, more writes than the rows (1000 tables).
func (p *policy) pick(now time.Time, draining bool) []*dstate {
	var ds []*dstate
	for _, d := range p.held {
		if len(d.work) > 0 && (d.rows || draining || d.written.IsZero() || now.Sub(d.written) >= p.cfg.checkpoint) {
			ds = append(ds, d)
		}
	}
	return ds
}

// committed records that ds's work committed, at at.
func (p *policy) committed(ds []*dstate, at time.Time) {
	for _, d := range ds {
		p.drop(d)
		d.failures, d.written = 0, at
	}
}

// failed records that the target refused d's work on its own (its own
// fault, not the connection's): the work is dropped and d is broken until
// its reset's BeginEpoch. It reports whether d's table stops: a schema
// change the sink cannot apply (permanent), or MaxFailures in a row.
func (p *policy) failed(d *dstate, permanent bool) (stop bool) {
	d.failures++
	p.drop(d)
	d.broken = true
	return permanent || d.failures >= p.cfg.maxFailures
}

// dropAll drops the work of every dispatcher held: the sink was
// superseded and writes nothing more.
func (p *policy) dropAll() {
	for _, d := range p.held {
		d.work, d.rows = d.dropWork(), false
	}
	p.pending, p.pendingBytes = 0, 0
}

// endRound closes a commit round that started at started and ended at
// ended: the next rows' deadline counts from started; the dstates without
// work leave held, and ckptDue is recomputed from those left (work a
// failed or lost commit kept, checkpoints not yet due).
func (p *policy) endRound(started, ended time.Time) {
	p.last, p.newest = started, 0
	p.ckptDue = time.Time{}
	kept := p.held[:0]
	for _, d := range p.held {
		if len(d.work) == 0 {
			d.held = false
			continue
		}
		kept = append(kept, d)
		if !d.rows {
			p.noteCheckpoint(d, ended)
		}
	}
	clear(p.held[len(kept):])
	p.held = kept
}

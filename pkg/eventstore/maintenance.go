package eventstore

import (
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/dueheap"
	"github.com/cdcflow/eventservice/pkg/common"
)

// Maintenance is driven by events, never by a walk over every subscription:
// a checkpoint that raises a subscription's GC target, or its last
// dispatcher leaving, schedules the subscription here, and the maintenance
// loop only pops what is due. Its cost follows change, not the number of
// subscriptions.
//
// GC. A subscription's pending range [gcDone, gcTarget) is deleted when it
// is "ripe" (it spans GCMinSpan of physical time: noted when a checkpoint
// makes it so) or when it has waited GCMaxDelay (a delay heap). All the
// deletions of a round go into one pebble batch, at most one round per
// GCInterval: pebble re-fragments the range tombstones of a memtable once
// per batch that adds some, and every new iterator reads the fragments, so
// a tombstone per subscription written on its own made every NewIterator
// pay for all the tombstones in the memtable.
//
// Only ranges that hold rows are deleted: a subscription that wrote nothing
// since its last deletion just moves its mark (noteGCLocked), so GC follows
// the rows written, not the checkpoints advanced.
//
// Idle expiry. A subscription whose last dispatcher left is pushed onto an
// idle heap at idleSince + IdleTTL; when due, expireIfIdle checks that it
// is still idle for long enough (a stale entry of a subscription that was
// reused meanwhile does nothing).
//
// Lock order: subscription.mu, then maintenance.mu (schedules are pushed
// under the subscription's lock); the loop takes maintenance.mu alone and
// releases it before taking any subscription's lock.
type maintenance struct {
	mu struct {
		sync.Mutex
		// ripe are subscriptions whose pending range reached GCMinSpan.
		ripe []*subscription
		// delay holds, per subscription with a pending range, an entry due
		// GCMaxDelay after the range became pending (token: its
		// gcPendingSince). Stale entries are skipped when popped.
		delay dueheap.Heap[dueEntry]
		// idle holds an entry per subscription that lost its last
		// dispatcher, due at idleSince + IdleTTL.
		idle dueheap.Heap[dueEntry]
	}
}

// dueEntry is a subscription scheduled at a time, with the state (token)
// it was scheduled for: gcPendingSince for the delay heap, idleSince for
// the idle heap. An entry whose token no longer matches is stale.
type dueEntry struct {
	sub   *subscription
	token time.Time
}

// noteGCLocked schedules sub's pending GC range, if it has one: a delay
// entry when it becomes pending, and the ripe list once it spans
// GCMinSpan. Called after anything that may raise the GC target. A zero
// now is read from the clock when needed: most calls (a checkpoint of a
// table with nothing to collect, or already pending) need none, and so
// skip a clock read.
// REQUIRES: sub.mu held.
func (s *Store) noteGCLocked(sub *subscription, now time.Time) {
	if sub.mu.removed || sub.mu.gcTarget <= sub.mu.gcDone {
		return
	}
	if sub.mu.pebbleMax == 0 || sub.mu.pebbleMax < sub.mu.gcDone {
		// No row at or above gcDone was ever written to pebble (the store
		// starts empty, rows below the GC target all are committed, since
		// the target is a checkpoint, at or below the resolved-ts, and a
		// write-behind subscription's rows may never reach pebble): the
		// range is empty. Move the mark without a tombstone, so a million
		// idle tables, or tables whose rows were read from memory and
		// checkpointed, cost no range deletions.
		sub.mu.gcDone = sub.mu.gcTarget
		return
	}
	m := &s.maint
	if sub.mu.gcPendingSince == 0 {
		if now.IsZero() {
			now = s.opts.Clock.Now()
		}
		sub.mu.gcPendingSince = stampOf(now)
		m.mu.Lock()
		m.mu.delay.Push(now.Add(s.opts.GCMaxDelay), dueEntry{sub: sub, token: now})
		m.mu.Unlock()
	}
	if !sub.mu.gcRipe && gcSpan(sub.mu.gcDone, sub.mu.gcTarget) >= s.opts.GCMinSpan {
		sub.mu.gcRipe = true
		m.mu.Lock()
		m.mu.ripe = append(m.mu.ripe, sub)
		m.mu.Unlock()
	}
}

// gcSpan is the physical time a pending range [from, to) covers.
func gcSpan(from, to common.Ts) time.Duration {
	return to.Physical().Sub(from.Physical())
}

// scheduleIdleLocked schedules sub's expiry after its last dispatcher left
// at now. REQUIRES: sub.mu held.
func (s *Store) scheduleIdleLocked(sub *subscription, now time.Time) {
	m := &s.maint
	m.mu.Lock()
	m.mu.idle.Push(now.Add(s.opts.IdleTTL), dueEntry{sub: sub, token: now})
	m.mu.Unlock()
}

// runMaintenance expires idle subscriptions every MaintenanceInterval and
// runs a GC round every GCInterval; both only touch what is due.
func (s *Store) runMaintenance() {
	t := s.opts.Clock.NewTicker(s.opts.MaintenanceInterval)
	defer t.Stop()
	var lastGC time.Time
	for {
		select {
		case <-t.C():
		case <-s.closing:
			return
		}
		now := s.opts.Clock.Now()
		s.expireDue(now)
		if now.Sub(lastGC) >= s.opts.GCInterval {
			s.collectGarbage(now)
			lastGC = now
		}
	}
}

// maintain runs everything due now: idle expiry and a GC round. Tests call
// it directly.
func (s *Store) maintain() {
	now := s.opts.Clock.Now()
	s.expireDue(now)
	s.collectGarbage(now)
}

// expireDue expires the subscriptions whose idle entry is due.
func (s *Store) expireDue(now time.Time) {
	s.maint.mu.Lock()
	due := s.maint.mu.idle.PopDue(now, nil)
	s.maint.mu.Unlock()
	for _, e := range due {
		if s.isClosing() {
			return
		}
		s.expireIfIdle(e.Item.sub, now)
	}
}

// gcDeletion is one range of a GC round, applied to its subscription once
// the round's batch committed.
type gcDeletion struct {
	sub      *subscription
	from, to common.Ts
}

// collectGarbage runs one GC round: every ripe subscription and every one
// whose pending range waited GCMaxDelay gets its range deleted, all in one
// pebble batch.
func (s *Store) collectGarbage(now time.Time) {
	m := &s.maint
	m.mu.Lock()
	ripe := m.mu.ripe
	m.mu.ripe = nil
	due := m.mu.delay.PopDue(now, nil)
	m.mu.Unlock()
	if len(ripe) == 0 && len(due) == 0 {
		return
	}
	var dels []gcDeletion
	take := func(sub *subscription, delayed bool, token time.Time) {
		sub.mu.Lock()
		defer sub.mu.Unlock()
		if delayed && sub.mu.gcPendingSince != stampOf(token) {
			return // stale: that range was deleted (or is pending anew)
		}
		sub.mu.gcRipe = false
		from, to := sub.mu.gcDone, sub.mu.gcTarget
		if sub.mu.removed || to <= from || sub.mu.gcPendingSince == 0 {
			return
		}
		sub.mu.gcPendingSince = 0
		dels = append(dels, gcDeletion{sub: sub, from: from, to: to})
	}
	for _, sub := range ripe {
		take(sub, false, time.Time{})
	}
	for _, e := range due {
		take(e.Item.sub, true, e.Item.token)
	}
	if len(dels) == 0 {
		return
	}
	b := s.db.NewBatch()
	defer b.Close()
	for _, d := range dels {
		// Rows with commit-ts < to go; a row at exactly the minimum
		// checkpoint stays, and nothing above any checkpoint is touched.
		if err := b.DeleteRange(tsBoundary(d.sub.id, d.from), tsBoundary(d.sub.id, d.to), nil); err != nil {
			s.gcFailed(dels, now, err)
			return
		}
	}
	if err := b.Commit(pebble.NoSync); err != nil {
		s.gcFailed(dels, now, err)
		return
	}
	s.metrics.gcRounds.Inc()
	s.metrics.gcRangesDeleted.Add(float64(len(dels)))
	for _, d := range dels {
		d.sub.mu.Lock()
		d.sub.mu.gcDone = max(d.sub.mu.gcDone, d.to)
		d.sub.mu.Unlock()
	}
}

// gcFailed puts the ranges of a failed round back, ripe, so the next round
// retries them.
func (s *Store) gcFailed(dels []gcDeletion, now time.Time, err error) {
	s.log.Error("gc round failed; retrying at the next round", zap.Int("ranges", len(dels)), zap.Error(err))
	for _, d := range dels {
		d.sub.mu.Lock()
		if !d.sub.mu.gcRipe {
			d.sub.mu.gcRipe = true
			s.maint.mu.Lock()
			s.maint.mu.ripe = append(s.maint.mu.ripe, d.sub)
			s.maint.mu.Unlock()
		}
		if d.sub.mu.gcPendingSince == 0 {
			d.sub.mu.gcPendingSince = stampOf(now)
		}
		d.sub.mu.Unlock()
	}
}

// expireIfIdle ends sub at the upstream and deletes its data when it has
// had no dispatcher for IdleTTL.
func (s *Store) expireIfIdle(sub *subscription, now time.Time) {
	s.mu.Lock()
	sub.mu.Lock()
	idle := !sub.mu.removed && sub.mu.idleSince != 0 && now.Sub(sub.mu.idleSince.time()) >= s.opts.IdleTTL
	if idle {
		// Marked under s.mu, so RegisterDispatcher can no longer pick it.
		sub.mu.removed = true
		s.dropFreshLocked(sub)
		s.unlinkSpanLocked(sub)
		s.mu.nsubs--
		s.metrics.subscriptions.Set(float64(s.mu.nsubs))
	}
	sub.mu.Unlock()
	s.mu.Unlock()
	if !idle {
		return
	}
	// End the feed without holding any lock (the upstream may be waiting
	// for its own Push to return), then pass through pushMu so a Push that
	// was already past its removed check is queued before the deletion.
	sub.upstream.Close()
	sub.pushMu.Lock()
	sub.pushMu.Unlock() //nolint:staticcheck // an intentional barrier
	select {
	case s.queues[sub.worker()] <- writeEvent{sub: sub, deleteSub: true}:
		s.metrics.subsRemoved.Inc()
		s.log.Debug("idle subscription ended", zap.Uint64("sub", sub.id), zap.Stringer("span", sub.span))
	case <-s.closing:
	}
}

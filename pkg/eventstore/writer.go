package eventstore

import (
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/touchahead"
	"github.com/cdcflow/eventservice/pkg/common"
)

// writeEvent is one accepted Push, or the deletion of an ended
// subscription. Events of a subscription go through one worker's queue, so
// they apply in push order and a deletion follows every write before it.
type writeEvent struct {
	sub      *subscription
	rows     []common.Row
	resolved common.Ts
	// advance, when set (sub is nil), is a chunk of a PushResolved call's
	// subscriptions on this worker, each advancing to resolved; the
	// worker gives it back to the store's pool once published.
	advance *advanceBuf
	// deleteSub deletes every row of sub; it is queued after the
	// subscription was ended at the upstream and no Push can follow.
	deleteSub bool
	// deferred: apply kept rows out of the pebble batch, to be held only
	// in the subscription's fresh rows (writebehind.go).
	deferred bool
}

// runWriter is write worker i: it groups queued events into one pebble batch
// (up to MaxBatchRows rows or MaxBatchBytes bytes), commits it, and only then advances resolved-ts
// and notifies, so a notified resolved-ts never names an unreadable row.
func (s *Store) runWriter(i int) {
	q := s.queues[i]
	evs := make([]writeEvent, 0, 64)
	for {
		select {
		case ev := <-q:
			evs = append(evs[:0], ev)
		case <-s.closing:
			return
		}
		rows, bytes := len(evs[0].rows), rowsBytes(evs[0].rows)
	group:
		for rows < s.opts.MaxBatchRows && bytes < s.opts.MaxBatchBytes && !evs[len(evs)-1].deleteSub {
			select {
			case ev := <-q:
				evs = append(evs, ev)
				rows, bytes = rows+len(ev.rows), bytes+rowsBytes(ev.rows)
			default:
				break group
			}
		}
		if err := s.apply(evs); err != nil {
			// A failed commit leaves resolved-ts where it was: dispatchers
			// are not told about rows that are not readable. The store
			// cannot recover by itself; it logs loudly and keeps serving.
			s.log.Error("write batch failed", zap.Int("worker", i), zap.Error(err))
		}
		// The advances' room comes back whether or not the batch was
		// applied: a failed commit must not shrink it for good.
		for _, ev := range evs {
			if ev.advance != nil {
				s.advanceRoom[i].release(len(ev.advance.subs))
				s.putAdvanceBuf(ev.advance)
			}
		}
		clear(evs) // drop row references for the GC
	}
}

// rowsBytes is the bytes of rows' keys and values (Row.Size).
func rowsBytes(rows []common.Row) int {
	n := 0
	for i := range rows {
		n += rows[i].Size()
	}
	return n
}

// apply commits evs and then publishes their resolved-ts advances. The
// rows of a write-behind subscription may be kept out of pebble
// (writebehind.go).
func (s *Store) apply(evs []writeEvent) error {
	start := s.opts.Clock.Now()
	b := s.db.NewBatch()
	seq := s.batchSeq.Add(1)
	var rows, bytes, spilledRows, spilledBytes int
	var spilled []*subscription // wrote what they held in memory only
	for i := range evs {
		ev := &evs[i]
		if ev.deleteSub || len(ev.rows) == 0 {
			continue
		}
		switch s.planRows(ev, seq) {
		case planDefer:
			ev.deferred = true
			continue
		case planSpill:
			held, moved, err := s.addMemoryOnly(b, ev.sub, evs[:i])
			if err != nil {
				_ = b.Close()
				return err
			}
			spilledRows, spilledBytes = spilledRows+held.rows, spilledBytes+held.bytes
			rows, bytes = rows+moved.rows, bytes+moved.bytes // written at their commit after all
			spilled = append(spilled, ev.sub)
		}
		n, k, err := addRowsAbove(b, ev.sub.id, ev.rows, 0)
		if err != nil {
			_ = b.Close()
			return err
		}
		rows, bytes = rows+n, bytes+k
	}
	if rows+spilledRows > 0 {
		if err := b.Commit(pebble.NoSync); err != nil {
			_ = b.Close()
			return fmt.Errorf("eventstore: commit: %w", err)
		}
	}
	if err := b.Close(); err != nil {
		return fmt.Errorf("eventstore: close batch: %w", err)
	}
	for _, sub := range spilled {
		s.markAllWritten(sub)
	}
	now := s.opts.Clock.Now()
	if rows+spilledRows > 0 {
		s.metrics.writeBatch.Observe(now.Sub(start).Seconds())
		s.metrics.rowsWritten.Add(float64(rows))
		s.metrics.bytesWritten.Add(float64(bytes))
	}
	if spilledRows > 0 {
		s.countSpilled(spilledRows, spilledBytes)
	}
	s.countDeferred(evs)
	var pub published
	for _, ev := range evs {
		if ev.deleteSub {
			s.deleteSubscriptionData(ev.sub)
			continue
		}
		if ev.advance != nil {
			s.publishAdvances(ev.advance.subs, ev.resolved, now, &pub)
		}
		if ev.sub != nil {
			s.publish(ev, now, &pub)
		}
	}
	if pub.advances > 0 {
		// Once per batch, not per advance: at a million advances a second a
		// histogram update and a shared counter's add each would tax the writer.
		s.metrics.resolvedLag.Observe(pub.maxLag.Seconds())
		s.metrics.notifications.Add(float64(pub.notified))
		if h := s.knobs.accounted; h != nil {
			h(pub.notified)
		}
	}
	return nil
}

// countDeferred counts the rows of evs kept in memory only.
func (s *Store) countDeferred(evs []writeEvent) {
	var rows, bytes int
	for i := range evs {
		if ev := &evs[i]; ev.deferred {
			rows += len(ev.rows)
			for j := range ev.rows {
				bytes += encodedKeyLen(ev.rows[j].Key) + encodedValueLen(&ev.rows[j])
			}
		}
	}
	if rows > 0 {
		s.metrics.rowsDeferred.Add(float64(rows))
		s.metrics.bytesDeferred.Add(float64(bytes))
	}
}

// published is what one write batch's publishing did, for its metrics.
type published struct {
	advances, notified int
	maxLag             time.Duration // of the oldest resolved-ts advanced to
}

// publish records the commit of ev's rows and, if ev advances resolved-ts,
// notifies the subscription's dispatchers.
func (s *Store) publish(ev writeEvent, now time.Time, pub *published) {
	subscribers, mc, advanced, notify := s.commit(ev, now, pub)
	if notify {
		s.notifyAll(subscribers, ev.resolved, mc, pub)
	}
	if h := s.knobs.published; h != nil && advanced {
		h(ev.resolved)
	}
}

// publishAdvances is publish for a batch of advances without rows, a
// chunk at a time: each chunk's subscription locks are touched ahead, its
// subscriptions committed, then their
// dispatchers' memory is touched ahead (internal/touchahead: the
// subscribers and, through TouchAheader, what their notifiers read
// first), then they are notified in order. At a million dispatchers each
// of those is a cache miss, and taken one at a time they do not overlap.
func (s *Store) publishAdvances(subs []*subscription, resolved common.Ts, now time.Time, pub *published) {
	var pending [touchahead.Chunk]struct {
		subscribers      []*subscriber
		mc               common.Ts
		advanced, notify bool
	}
	for start := 0; start < len(subs); start += touchahead.Chunk {
		chunk := subs[start:min(start+touchahead.Chunk, len(subs))]
		for _, sub := range chunk {
			touchahead.Lock(&sub.mu.Mutex) // commit's first miss
		}
		for i, sub := range chunk {
			p := &pending[i]
			p.subscribers, p.mc, p.advanced, p.notify = s.commit(writeEvent{sub: sub, resolved: resolved}, now, pub)
		}
		for i := range chunk {
			if p := &pending[i]; p.notify {
				for _, sb := range p.subscribers {
					sb.touchAhead()
				}
			}
		}
		for i := range chunk {
			p := &pending[i]
			if p.notify {
				s.notifyAll(p.subscribers, resolved, p.mc, pub)
			}
			if h := s.knobs.published; h != nil && p.advanced {
				h(resolved)
			}
			p.subscribers = nil
		}
	}
}

// notifyAll notifies subscribers of resolved (maxCommit mc).
func (s *Store) notifyAll(subscribers []*subscriber, resolved, mc common.Ts, pub *published) {
	for _, sb := range subscribers {
		if sb.notify(s, resolved, mc) {
			pub.notified++
		}
	}
}

// commit records the commit of ev's rows and its resolved-ts in ev.sub,
// and returns its subscribers: advanced, ev moved its resolved-ts;
// notify, and the throttle does not hold the notification.
func (s *Store) commit(ev writeEvent, now time.Time, pub *published) (subscribers []*subscriber, mc common.Ts, advanced, notify bool) {
	sub := ev.sub
	var maxCommit common.Ts
	for j := range ev.rows {
		maxCommit = max(maxCommit, ev.rows[j].CommitTs)
	}
	sub.mu.Lock()
	sub.mu.maxCommit = max(sub.mu.maxCommit, maxCommit)
	if !ev.deferred {
		sub.mu.pebbleMax = max(sub.mu.pebbleMax, maxCommit)
	}
	if !s.keepFreshLocked(sub, ev.rows, ev.deferred) {
		// Rows held in memory only could not be written to pebble when
		// they had to be: as after a failed commit, resolved-ts stays.
		sub.mu.Unlock()
		return
	}
	if ev.resolved <= sub.mu.resolved {
		sub.mu.Unlock()
		return
	}
	sub.mu.resolved = ev.resolved
	held := s.throttledLocked(sub, now) // then the throttle notifies the latest later
	subscribers, mc = sub.mu.subscribers, sub.mu.maxCommit
	sub.mu.Unlock()
	pub.advances++
	pub.maxLag = max(pub.maxLag, ev.resolved.Lag(now))
	return subscribers, mc, true, !held
}

// deleteSubscriptionData removes every row of an ended subscription.
func (s *Store) deleteSubscriptionData(sub *subscription) {
	if err := s.db.DeleteRange(subBoundary(sub.id), subBoundary(sub.id+1), pebble.NoSync); err != nil {
		s.log.Error("delete ended subscription", zap.Uint64("sub", sub.id), zap.Error(err))
		return
	}
	s.metrics.gcRangesDeleted.Inc()
}

// validateRows returns the rows of a push that may be stored, and an error
// describing the ones refused (counted by reason). The input slice is
// returned unchanged when every row is valid, which is the common case.
// REQUIRES: sub.pushMu held.
func (s *Store) validateRows(sub *subscription, rows []common.Row) ([]common.Row, error) {
	var good []common.Row // nil until the first refused row
	var errs []error
	refused := 0
	for i := range rows {
		err := s.rowProblem(sub, &rows[i])
		if err == nil {
			if good != nil {
				good = append(good, rows[i])
			}
			continue
		}
		if good == nil {
			good = make([]common.Row, i, len(rows))
			copy(good, rows[:i])
		}
		refused++
		if len(errs) < 8 { // bound the error text of a hostile batch
			errs = append(errs, err)
		}
	}
	if refused == 0 {
		return rows, nil
	}
	if refused > len(errs) {
		errs = append(errs, fmt.Errorf("%d rows refused in all", refused))
	}
	return good, errors.Join(errs...)
}

// rowProblem returns why r may not be stored in sub, counting it.
func (s *Store) rowProblem(sub *subscription, r *common.Row) error {
	switch {
	case !r.Op.Valid() || len(r.Key) == 0 || r.StartTs >= r.CommitTs:
		s.metrics.rejectedRows.WithLabelValues(rejectInvalid).Inc()
		return fmt.Errorf("%w: op %v key %x start-ts %v commit-ts %v", ErrInvalidRow, r.Op, r.Key, r.StartTs, r.CommitTs)
	case r.CommitTs <= sub.pushedResolved:
		s.metrics.rejectedRows.WithLabelValues(rejectBeforeResolved).Inc()
		return fmt.Errorf("%w: commit-ts %v, resolved-ts %v, key %x", ErrRowBeforeResolved, r.CommitTs, sub.pushedResolved, r.Key)
	case !sub.span.Contains(r.Key):
		s.metrics.rejectedRows.WithLabelValues(rejectOutsideSpan).Inc()
		return fmt.Errorf("%w: key %x not in %v", ErrRowOutsideSpan, r.Key, sub.span)
	}
	return nil
}

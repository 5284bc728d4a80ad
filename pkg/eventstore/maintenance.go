package eventstore

import (
	"time"

	"github.com/cockroachdb/pebble/v2"
	"go.uber.org/zap"
)

// runMaintenance periodically deletes garbage-collectable ranges and ends
// subscriptions that stayed idle for IdleTTL.
func (s *Store) runMaintenance() {
	t := s.opts.Clock.NewTicker(s.opts.MaintenanceInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C():
			s.maintain()
		case <-s.closing:
			return
		}
	}
}

// maintain runs one GC and idle-expiry pass.
func (s *Store) maintain() {
	now := s.opts.Clock.Now()
	s.mu.RLock()
	subs := make([]*subscription, 0, len(s.mu.subs))
	for _, sub := range s.mu.subs {
		subs = append(subs, sub)
	}
	s.mu.RUnlock()
	for _, sub := range subs {
		if s.isClosing() {
			return
		}
		s.gcSubscription(sub, now)
		s.expireIfIdle(sub, now)
	}
}

// gcSubscription deletes the rows of sub below its GC target when the
// pending range is large enough or has waited long enough. Coalescing the
// checkpoints into few, wide range deletions keeps pebble from drowning in
// tiny range tombstones.
func (s *Store) gcSubscription(sub *subscription, now time.Time) {
	sub.mu.Lock()
	from, to := sub.mu.gcDone, sub.mu.gcTarget
	if sub.mu.removed || to <= from {
		sub.mu.Unlock()
		return
	}
	if sub.mu.gcPendingSince.IsZero() {
		sub.mu.gcPendingSince = now
	}
	wide := to.Physical().Sub(from.Physical()) >= s.opts.GCMinSpan
	old := now.Sub(sub.mu.gcPendingSince) >= s.opts.GCMaxDelay
	sub.mu.Unlock()
	if !wide && !old {
		return
	}
	// Rows with commit-ts < to go; a row at exactly the minimum checkpoint
	// stays, and nothing above any checkpoint is ever touched.
	if err := s.db.DeleteRange(tsBoundary(sub.id, from), tsBoundary(sub.id, to), pebble.NoSync); err != nil {
		s.log.Error("gc range deletion failed", zap.Uint64("sub", sub.id), zap.Error(err))
		return
	}
	s.metrics.gcRangesDeleted.Inc()
	sub.mu.Lock()
	sub.mu.gcDone = to
	sub.mu.gcPendingSince = time.Time{}
	sub.mu.Unlock()
}

// expireIfIdle ends sub at the upstream and deletes its data when it has
// had no dispatcher for IdleTTL.
func (s *Store) expireIfIdle(sub *subscription, now time.Time) {
	s.mu.Lock()
	sub.mu.Lock()
	idle := !sub.mu.removed && !sub.mu.idleSince.IsZero() && now.Sub(sub.mu.idleSince) >= s.opts.IdleTTL
	if idle {
		// Marked under s.mu, so RegisterDispatcher can no longer pick it.
		sub.mu.removed = true
		key := sub.span.Key()
		list := s.mu.subsBySpan[key]
		for i, x := range list {
			if x == sub {
				list = append(list[:i:i], list[i+1:]...)
				break
			}
		}
		if len(list) == 0 {
			delete(s.mu.subsBySpan, key)
		} else {
			s.mu.subsBySpan[key] = list
		}
		delete(s.mu.subs, sub.id)
		s.metrics.subscriptions.Set(float64(len(s.mu.subs)))
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
	case s.queues[sub.worker] <- writeEvent{sub: sub, deleteSub: true}:
		s.metrics.subsRemoved.Inc()
		s.log.Debug("idle subscription ended", zap.Uint64("sub", sub.id), zap.Stringer("span", sub.span))
	case <-s.closing:
	}
}

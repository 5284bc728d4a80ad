package eventstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
)

// Notifier is a dispatcher's callback. The store calls Notify with the
// subscription's new resolved-ts and the largest commit-ts among the
// subscription's committed rows (a hint: no row at or below resolvedTs has a
// larger commit-ts). Every row with commit-ts <= resolvedTs is readable
// through an iterator when the callback runs.
//
// Calls for one dispatcher are serialised and strictly increasing in
// resolvedTs. The store measures the real time spent inside the callback.
//
// Lock rule: the callback runs holding the dispatcher's subscriber lock, on
// the store's writer goroutine (or its throttle's, or the goroutine of
// RegisterDispatcher for the first call), with no store-wide lock held.
// It must not block, and must call neither UnregisterDispatcher for its
// own dispatcher (it waits for a callback in flight under that lock) nor
// Close (it waits for the writer): either would wait for itself. Other
// store calls are safe from it, but a callback that does real work delays
// every subscription behind it: queue the work and return (the event
// service's does).
//
// It is an interface, not a func, so that an embedder's dispatcher is the
// notifier itself: a method value passed as a func (d.Notify) is a closure, a
// separate heap object per dispatcher that every notification loads
// before the dispatcher (a cold cache line of its own at a million
// dispatchers), and one more object per registration for the GC to mark.
// NotifierFunc adapts a func.
type Notifier interface {
	Notify(resolvedTs, maxCommitTs common.Ts)
}

// TouchAheader is implemented by a Notifier that can read, changing
// nothing, the memory its next Notify reads first. The store calls it for
// a chunk of dispatchers before it notifies them, so that their cache
// misses overlap instead of coming one notification at a time
// (internal/touchahead). It must not block, lock or write.
type TouchAheader interface {
	TouchAhead()
}

// NotifierFunc adapts an ordinary function to Notifier.
type NotifierFunc func(resolvedTs, maxCommitTs common.Ts)

// Notify calls f.
func (f NotifierFunc) Notify(resolvedTs, maxCommitTs common.Ts) { f(resolvedTs, maxCommitTs) }

// subscriber is one registered dispatcher.
//
// INVARIANT: notifier is never called after stop returned, and never with a
// resolved-ts at or below a previously notified one or the start-ts.
type subscriber struct {
	id       common.DispatcherID
	startTs  common.Ts
	sub      *subscription
	notifier Notifier

	// checkpoint and detached (removed from sub by UnregisterDispatcher)
	// are guarded by sub.mu.
	checkpoint common.Ts
	detached   bool

	// mu serialises callbacks of this dispatcher and orders them against
	// stop. It is held across the callback, so stop waits for one in
	// flight.
	mu struct {
		sync.Mutex
		lastNotified common.Ts
		stopped      bool
		// notifies counts the callbacks, to time one in notifySampleEvery.
		notifies uint32
	}
}

// notifySampleEvery: one callback in this many of each dispatcher is timed
// (every notifySampleEvery-th, from an offset of its own). Timing costs two
// clock reads and two histogram updates, several times the callback itself,
// which at a million notifications a second would be a share of a core. The
// count of callbacks is exact (notifications_total).
//
// The offset keeps the quantiles unbiased: a dispatcher's first callback
// is slower than its others (its first preparation, cold memory), and
// timing every dispatcher's first made them one sample in eight at 10k
// dispatchers of about 15 timed callbacks each, enough to be the whole
// p99. With the offset a first callback is timed as often as any other,
// one in notifySampleEvery.
const notifySampleEvery = 8

// sampleOffset is where a dispatcher's count of callbacks starts: spread
// over [0, notifySampleEvery) by its ID, so that which of its callbacks
// are timed does not depend on their place in its sequence.
func sampleOffset(id common.DispatcherID) uint32 {
	return uint32((id.Hi ^ id.Lo*0x9e3779b97f4a7c15) >> 61)
}

// notify calls the notifier if resolved is news for this dispatcher, and
// reports whether it did; the caller counts the calls in
// notifications_total (the write worker once per batch: an increment per
// callback was a shared cache line written a million times a second).
func (sb *subscriber) notify(s *Store, resolved, maxCommit common.Ts) (called bool) {
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if sb.mu.stopped || resolved <= sb.mu.lastNotified || resolved <= sb.startTs {
		return false
	}
	sb.mu.lastNotified = resolved
	sb.mu.notifies++
	if sb.mu.notifies%notifySampleEvery != 1 {
		sb.notifier.Notify(resolved, maxCommit)
		return true
	}
	sw := clock.StartStopwatch() // real time, the one place the notify path is timed
	sb.notifier.Notify(resolved, maxCommit)
	d := sw.Elapsed()
	s.notifyLatency.Record(d)
	s.metrics.notifyDuration.Observe(d.Seconds())
	return true
}

// touchAhead reads the subscriber's lines and has its notifier read what
// its Notify will (TouchAheader). It changes nothing.
func (sb *subscriber) touchAhead() {
	if t, ok := sb.notifier.(TouchAheader); ok {
		t.TouchAhead()
	}
}

// stop prevents further callbacks, waiting for one in flight. waiting, if
// not nil, runs when a callback is in flight and stop is about to wait for
// it (a test hook: it makes "Unregister waits" observable).
func (sb *subscriber) stop(waiting func()) {
	if !sb.mu.TryLock() {
		if waiting != nil {
			waiting()
		}
		sb.mu.Lock()
	}
	sb.mu.stopped = true
	sb.mu.Unlock()
}

// subscription is the store's cache of one span fed by one upstream
// subscription. Dispatchers with an identical span share it.
//
// Lock order: Store.mu before subscription.mu; subscriber.mu is never held
// while taking either (callbacks run with only subscriber.mu held).
// pushMu is independent of both and never held while taking them... except
// subscription.mu, which Push reads under pushMu (pushMu before mu).
type subscription struct {
	id      uint64
	span    common.PackedSpan
	startTs common.Ts

	// upstream is set once at creation, before the subscription is
	// published, and closed when the subscription is removed.
	upstream Subscription
	// store is the subscription's store, for its sink.
	store *Store
	// slot is the subscription's slot in Store.mu.subs; nextSameSpan the
	// slot of the next older subscription of its span (0: none), which
	// chains them from Store.mu.subsBySpan: slots, not pointers, so that
	// no store map holds a pointer for a GC cycle to visit in hash order.
	// Guarded by Store.mu.
	slot, nextSameSpan uint32

	// pushMu serialises Push so that validation order is queue order.
	pushMu sync.Mutex
	// pushedResolved is the largest resolved-ts accepted into the write
	// queue (guarded by pushMu). Rows at or below it are refused.
	pushedResolved common.Ts

	// wb is the subscription's part of the write batch its worker is
	// building (writebehind.go); the worker's alone.
	wb wbBatch

	mu struct {
		sync.Mutex
		// resolved is the committed resolved-ts: every row at or below it is
		// readable (in pebble, or in the fresh rows of a write-behind
		// subscription: fresh.go). Written by the subscription's write
		// worker only.
		resolved common.Ts
		// maxCommit is the largest commit-ts of committed rows.
		maxCommit common.Ts
		// pebbleMax is the largest commit-ts of the rows written to pebble
		// (at or below maxCommit: a write-behind subscription's rows may be
		// in memory only), so GC issues no range deletion where pebble
		// holds nothing.
		pebbleMax common.Ts
		// subscribers is replaced, never mutated, so the write worker can
		// iterate a snapshot without the lock. The first list of one
		// subscriber is one[:], written once (oneUsed) and never again, so
		// a snapshot of it stays what it was; a subscription of one
		// dispatcher, the common case, then has no slice of its own for
		// the GC to mark. (one[0] keeps its subscriber reachable as long as
		// the subscription is, even after it left: one stale subscriber per
		// subscription at most, memory only.)
		subscribers []*subscriber
		one         [1]*subscriber
		// lowWatermark: rows at or below it may be gone (the subscription's
		// start-ts, then the minimum checkpoint). A dispatcher may share the
		// subscription only if its start-ts is at or above it.
		lowWatermark common.Ts
		// gcTarget is the minimum checkpoint of the subscribers; rows below
		// it may be deleted. gcDone is how far deletion went.
		gcTarget, gcDone common.Ts
		// fresh is the newest committed rows, served to scans without
		// pebble (fresh.go); nil until the first row is committed.
		fresh *freshRows
		// gcPendingSince is when [gcDone, gcTarget) became pending (zero:
		// nothing pending, or taken by a GC round); gcRipe: it is in the
		// ripe list (see maintenance).
		gcPendingSince stamp
		// notifiedAt is when the subscribers were last told of an advance;
		// notifyHeld: an advance is held back by NotifyInterval and the
		// throttle will notify it (see throttle.go).
		notifiedAt stamp
		// idleSince is when the last subscriber left; zero while it has any.
		idleSince stamp
		// atTarget counts the subscribers whose checkpoint is at or below
		// gcTarget (at least one while there are any, since the target is
		// never above the minimum when it is computed): while another is
		// still there, an advance past the target cannot move it, and
		// updateCheckpoint reads no other subscriber.
		atTarget int32
		// The flags share a word with atTarget (a subscription and its
		// first subscriber fit the 320-byte size class).
		gcRipe, notifyHeld, removed, oneUsed bool
	}
}

// worker is the index of the write worker that owns sub, a function of
// its ID: computed, not stored, so that a subscription and its first
// subscriber fit the 320-byte size class with a Notifier of two words.
func (sub *subscription) worker() int {
	return common.DispatcherIDFromUint64(sub.id).Index(len(sub.store.queues))
}

// progress returns the committed resolved-ts and max commit-ts.
func (sub *subscription) progress() (resolved, maxCommit common.Ts) {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	return sub.mu.resolved, sub.mu.maxCommit
}

func (sub *subscription) isRemoved() bool {
	sub.mu.Lock()
	defer sub.mu.Unlock()
	return sub.mu.removed
}

// addSubscriberLocked publishes sb. REQUIRES: sub.mu held.
func (sub *subscription) addSubscriberLocked(sb *subscriber) {
	if len(sub.mu.subscribers) == 0 && !sub.mu.oneUsed {
		sub.mu.oneUsed = true
		sub.mu.one[0] = sb
		sub.mu.subscribers = sub.mu.one[:]
	} else {
		next := make([]*subscriber, 0, len(sub.mu.subscribers)+1)
		next = append(next, sub.mu.subscribers...)
		sub.mu.subscribers = append(next, sb)
	}
	sub.mu.idleSince = 0
	sub.recomputeGCLocked()
}

// removeSubscriberLocked unpublishes sb and reports whether sub became
// idle. REQUIRES: sub.mu held.
func (sub *subscription) removeSubscriberLocked(sb *subscriber, now time.Time) (idle bool) {
	sb.detached = true
	var next []*subscriber // nil, no allocation, when sb was the only one
	if n := len(sub.mu.subscribers); n > 1 || n == 1 && sub.mu.subscribers[0] != sb {
		next = make([]*subscriber, 0, n)
		for _, x := range sub.mu.subscribers {
			if x != sb {
				next = append(next, x)
			}
		}
	}
	sub.mu.subscribers = next
	if len(next) == 0 {
		sub.mu.idleSince = stampOf(now)
	}
	sub.recomputeGCLocked()
	return len(next) == 0
}

// recomputeGCLocked derives the GC target from the subscribers'
// checkpoints. It never moves backwards. REQUIRES: sub.mu held.
func (sub *subscription) recomputeGCLocked() {
	if len(sub.mu.subscribers) == 0 {
		return
	}
	minCkpt := sub.mu.subscribers[0].checkpoint
	for _, sb := range sub.mu.subscribers[1:] {
		minCkpt = min(minCkpt, sb.checkpoint)
	}
	if minCkpt > sub.mu.gcTarget {
		sub.mu.gcTarget = minCkpt
	}
	sub.mu.atTarget = 0
	for _, sb := range sub.mu.subscribers {
		if sb.checkpoint <= sub.mu.gcTarget {
			sub.mu.atTarget++
		}
	}
	sub.mu.lowWatermark = max(sub.mu.lowWatermark, sub.mu.gcTarget)
}

// sink is the Sink the store hands to the upstream for one subscription:
// the subscription itself under another name ((*sink)(sub)), so that it
// costs neither an object nor a field of its own.
type sink subscription

// Push validates b and queues it to the subscription's write worker. See
// Sink.Push for the contract.
func (k *sink) Push(ctx context.Context, b Batch) error {
	sub := (*subscription)(k)
	s := sub.store
	sub.pushMu.Lock()
	defer sub.pushMu.Unlock()
	if s.isClosing() {
		return ErrClosed
	}
	if sub.isRemoved() {
		return fmt.Errorf("%w: subscription %d of %v has ended", ErrClosed, sub.id, sub.span)
	}
	rows, err := s.validateRows(sub, b.Rows)
	resolved := b.ResolvedTs
	if resolved != 0 && resolved < sub.pushedResolved {
		err = joinErr(err, fmt.Errorf("%w: %v below %v for %v", ErrResolvedTsRegressed, resolved, sub.pushedResolved, sub.span))
		resolved = 0
	} else if resolved <= sub.pushedResolved {
		resolved = 0 // not an advance; nothing to do
	}
	if len(rows) == 0 && resolved == 0 {
		return err
	}
	ev := writeEvent{sub: sub, rows: rows, resolved: resolved}
	select {
	case s.queues[sub.worker()] <- ev:
	case <-ctx.Done():
		return joinErr(err, ctx.Err())
	case <-s.closing:
		return ErrClosed
	}
	if resolved != 0 {
		sub.pushedResolved = resolved
	}
	return err
}

// stamp is a point in time as Unix nanoseconds, zero meaning "none": a
// subscription keeps three of them, and as time.Time (24 bytes each) they
// took a size class more per subscription, which a million idle tables
// pay for.
type stamp int64

func stampOf(t time.Time) stamp { return stamp(t.UnixNano()) }

func (st stamp) time() time.Time { return time.Unix(0, int64(st)) }

// SlotKey is sb's key in the store's index of dispatchers (slots.Keyed).
func (sb *subscriber) SlotKey() common.DispatcherID { return sb.id }

package pendingset

import (
	"errors"
	"fmt"
	"math"
	"time"

	"go.uber.org/zap"

	ibackoff "github.com/cdcflow/eventservice/internal/backoff"
)

// Complete reports the outcome of delivering batch, a slice of entries
// returned by Drain (any subset of one or more Drain calls, each entry
// exactly once). The semantics:
//
//   - err != nil: the whole batch failed (connection down, target busy).
//     Every key is kept and goes back to the head of the FIFO in batch
//     order, ahead of keys that became pending later; no key spends budget
//     and the per-entry Results are ignored. Backing off is the caller's
//     business (the Pump backs itself off).
//   - err == nil: each entry's Result decides. Delivered: the key is gone,
//     or queued once more at the tail if a newer value arrived while it was
//     in flight; its attempt count resets. FailedKey: one budgeted attempt
//     is spent and the key backs off exponentially, or is quarantined when
//     the count reaches MaxAttempts. RetryKey: no budget; the key backs off
//     by its count of consecutive transient retries.
//
// A failed key merges back idempotently: its value becomes
// Merge(failed value, value added while in flight), so a retry neither
// duplicates a delivery nor loses a newer value. Entries that are not in
// flight under the token Drain gave them (completed twice, or forged) are
// skipped and reported with ErrNotInFlight; an unknown Result keeps the key
// as a RetryKey and is reported with ErrInvalidResult. The rest of the
// batch is always applied.
func (s *Set[K, V]) Complete(batch []Entry[K, V], err error) error {
	if len(batch) == 0 {
		return nil
	}
	stale, invalid, ring, now := s.complete(batch, err)
	if ring {
		s.ring()
	}
	if s.metrics != nil {
		s.metrics.observeComplete(batch, now)
	}
	var errs []error
	if stale > 0 {
		errs = append(errs, fmt.Errorf("%w: %d of %d entries skipped", ErrNotInFlight, stale, len(batch)))
	}
	if invalid > 0 {
		errs = append(errs, fmt.Errorf("%w: %d of %d entries kept as RetryKey", ErrInvalidResult, invalid, len(batch)))
	}
	return errors.Join(errs...)
}

// complete is Complete under the lock, released by defer: Merge and the
// clock are the user's code and may panic. It reports the entries that were
// not in flight and those with an unknown Result, whether the doorbell
// must ring, and the time it read.
func (s *Set[K, V]) complete(batch []Entry[K, V], err error) (stale, invalid int, ring bool, now int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now = s.nowLocked()
	if err != nil {
		s.mu.stats.BatchFailures++
		// Walk backwards, prepending, so the batch keeps its order at the head.
		for j := len(batch) - 1; j >= 0; j-- {
			e := &batch[j]
			i, ok := s.inFlightLocked(e)
			if !ok {
				stale++
				continue
			}
			s.readyLocked(i, s.mergeBackLocked(i, e), true)
			s.mu.stats.BatchRetries++
			ring = true
		}
	} else {
		for j := range batch {
			e := &batch[j]
			i, ok := s.inFlightLocked(e)
			if !ok {
				stale++
				continue
			}
			switch e.Result {
			case Delivered:
				ring = s.deliveredLocked(i, e.Value) || ring
			case FailedKey:
				ring = s.retryLocked(i, e, now, true) || ring
			case RetryKey:
				ring = s.retryLocked(i, e, now, false) || ring
			default:
				invalid++
				ring = s.retryLocked(i, e, now, false) || ring
			}
		}
	}
	return stale, invalid, ring, now
}

// inFlightLocked returns e's node if e is the current in-flight entry of
// its key. The entry carries its node index, so this costs no map lookup.
// The token is unique per Drain call (and starts at a random value per set,
// so entries of another set do not match), which rejects stale, repeated
// and forged entries; the unexported fields cannot be changed by a
// deliverer, so one that edits Key cannot misdirect a completion.
// REQUIRES: s.mu held.
func (s *Set[K, V]) inFlightLocked(e *Entry[K, V]) (int32, bool) {
	i := e.idx
	if e.token == 0 || i < 0 || int(i) >= len(s.mu.nodes) {
		return none, false
	}
	if s.mu.nodes[i].token != e.token || s.slotLocked(i).state != stateInFlight {
		return none, false
	}
	return i, true
}

// mergeBackLocked puts a failed entry's value back into its node, merged
// under any value added while it was in flight (which is newer). The
// earliest add time is the entry's. It returns the node's slot.
// REQUIRES: s.mu held; i in flight.
func (s *Set[K, V]) mergeBackLocked(i int32, e *Entry[K, V]) *slot[K, V] {
	n := s.slotLocked(i)
	if n.dirty {
		n.val = s.opts.Merge(e.Value, n.val)
	} else {
		n.val = e.Value
	}
	n.dirty = false
	s.setSinceLocked(i, n, e.since)
	return n
}

// deliveredLocked settles a delivered key and reports whether it was queued
// again. REQUIRES: s.mu held; i in flight.
func (s *Set[K, V]) deliveredLocked(i int32, v V) (requeued bool) {
	s.mu.stats.Delivered++
	s.noteDeliveredLocked(i, v)
	n := s.slotLocked(i)
	if n.dirty && s.supersededLocked(i, n.val) {
		n.dirty = false // added while in flight, but older than what went out
	}
	if !n.dirty {
		s.idleLocked(i, n)
		return false
	}
	// val and since already describe the dirty value.
	n.dirty = false
	c := &s.mu.nodes[i]
	c.attempts, c.transient = 0, 0
	s.readyLocked(i, n, false)
	return true
}

// retryLocked settles a per-key failure (budget true: FailedKey) or
// transient retry and reports whether the key became ready at once.
// REQUIRES: s.mu held; i in flight.
func (s *Set[K, V]) retryLocked(i int32, e *Entry[K, V], now int64, budget bool) (ready bool) {
	h := s.slotLocked(i)
	bypass := h.dirty && s.opts.Bypass != nil && s.opts.Bypass(e.Value, h.val)
	h = s.mergeBackLocked(i, e)
	n := &s.mu.nodes[i]
	var streak int32
	if budget {
		s.mu.stats.KeyFailures++
		n.attempts = satInc(n.attempts)
		streak = n.attempts
		if int(n.attempts) >= s.opts.MaxAttempts {
			s.mu.stats.Quarantines++
			s.waitLocked(i, h, stateQuarantined, now+int64(s.opts.QuarantineRetry))
			s.log.Warn("key quarantined", zap.Any("key", h.key), zap.Int32("attempts", n.attempts),
				zap.Duration("retry_in", s.opts.QuarantineRetry))
			return false
		}
	} else {
		s.mu.stats.KeyRetries++
		n.transient = satInc(n.transient)
		streak = n.transient
	}
	if bypass {
		s.mu.stats.Bypasses++
		s.readyLocked(i, h, false)
		return true
	}
	s.waitLocked(i, h, stateBackoff, now+int64(s.backoffLocked(int(streak))))
	return false
}

func satInc(x int32) int32 {
	if x == math.MaxInt32 {
		return x
	}
	return x + 1
}

// backoffLocked is the delay before retry number n (n >= 1):
// BackoffBase*2^(n-1), capped at BackoffMax, then shortened by up to
// Jitter. REQUIRES: s.mu held (Rand is not assumed goroutine-safe).
func (s *Set[K, V]) backoffLocked(n int) time.Duration {
	return backoff(n, s.opts.BackoffBase, s.opts.BackoffMax, s.opts.Jitter, s.opts.Rand())
}

// backoff computes min(max, base*2^(n-1)) * (1 - jitter*u), without
// overflow for any n: the module's one back-off, internal/backoff.Delay.
func backoff(n int, base, max time.Duration, jitter, u float64) time.Duration {
	return ibackoff.Delay(n, base, max, jitter, u)
}

// promoteDueLocked makes every backing-off or quarantined key whose time has
// come ready, in due order. REQUIRES: s.mu held.
func (s *Set[K, V]) promoteDueLocked(now int64) {
	for len(s.mu.heap) > 0 {
		i := s.mu.heap[0]
		n := &s.mu.nodes[i]
		if n.due > now {
			return
		}
		sl := s.slotLocked(i)
		if sl.state == stateQuarantined {
			s.mu.stats.Readmissions++
		}
		s.readyLocked(i, sl, false) // also pops i off the heap
	}
}

// NextDue returns when the earliest backing-off or quarantined key becomes
// ready, and false if there is none. A consumer that found Drain empty
// should wake at that time (or at the doorbell, whichever comes first).
func (s *Set[K, V]) NextDue() (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.mu.heap) == 0 {
		return time.Time{}, false
	}
	return s.base.Add(time.Duration(s.mu.nodes[s.mu.heap[0]].due)), true
}

// Len returns the number of distinct keys the set holds in any state:
// ready, in flight, backing off or quarantined. Its high-water mark
// (Stats.MaxLen) bounds the set's memory.
func (s *Set[K, V]) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.heldLocked()
}

// InFlight returns the number of keys drained and not yet completed.
func (s *Set[K, V]) InFlight() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.count[stateInFlight]
}

// Quarantined returns the number of quarantined keys.
func (s *Set[K, V]) Quarantined() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.count[stateQuarantined]
}

// QuarantinedKeys appends the quarantined keys to dst, in no particular
// order, so an operator or a test can see which keys keep failing.
func (s *Set[K, V]) QuarantinedKeys(dst []K) []K {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, i := range s.mu.heap {
		if sl := s.slotLocked(i); sl.state == stateQuarantined {
			dst = append(dst, sl.key)
		}
	}
	return dst
}

// settled reports whether nothing remains to deliver apart from
// quarantined keys: nothing ready, in flight or backing off. It also
// returns the quarantined count. The Pump's drain mode ends on it.
func (s *Set[K, V]) settled() (bool, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := &s.mu.count
	return c[stateReady]+c[stateInFlight]+c[stateBackoff] == 0, c[stateQuarantined]
}

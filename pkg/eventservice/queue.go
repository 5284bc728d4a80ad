package eventservice

import (
	"sync"

	"github.com/cdcflow/eventservice/internal/touchahead"
)

// prepareQueue is one preparation worker's FIFO of sessions: a ring of
// (session, generation) entries. A session is in at most one queue at most
// once (s.queued), so the live entries are bounded by the number of
// sessions hashed to the worker, whatever the notification rate.
//
// Unlinking a session (its removal, a reset, close) does not search the
// ring: it clears s.queued, which leaves its entry stale, and a push bumps
// s.qgen, so an entry is live iff its session is queued with the entry's
// generation. Pops skip stale entries, and a full ring is compacted rather
// than grown when stale entries outnumber live ones by more than
// queueSlack, so it grows only when at least about half its entries are
// live: its length stays within four times the most sessions queued at
// once, plus 2*queueSlack. Push and unlink are O(1), pop is amortised
// O(1), and nothing is allocated once the ring has reached its peak size.
// (s.qgen cannot come round to a stale entry's generation: a stale entry
// leaves the ring when a pop passes it or a compaction drops it, both long
// before 2^32 pushes of its session.)
//
// Why a ring and not the intrusive doubly linked list it was: a pop of a
// list reads the head's next link, a field of a session that is cold at a
// million dispatchers, so each pop waited for the previous one's cache
// miss, with the queue's lock held against every notification's push. The
// ring's entries are read in order, and each session's line on its own,
// touched a chunk ahead (internal/touchahead), so the misses overlap.
//
// INVARIANT: s.queued and s.qgen are guarded by q.mu; s.queued is true iff
// q.mu.ring holds exactly one live entry of s.
type prepareQueue struct {
	mu struct {
		sync.Mutex
		// ring[(head+i)%len(ring)] for i < n are the entries, oldest
		// first; live of them are live.
		ring    []queueEntry
		head, n int
		live    int
		closed  bool
		touched uint32 // keeps touchLocked's reads
	}
	// doorbell has capacity one: a push rings it without blocking; the
	// worker drains the whole queue per ring.
	doorbell chan struct{}
}

// queueEntry is a session pushed with generation gen.
type queueEntry struct {
	s   *session
	gen uint32
}

// queueSlack is how many stale entries the ring keeps without compacting
// beyond as many as there are live ones.
const queueSlack = 64

func newPrepareQueue() *prepareQueue {
	return &prepareQueue{doorbell: make(chan struct{}, 1)}
}

// push appends s and rings the doorbell. It never blocks. After close it
// drops s and returns false: nothing is enqueued once workers stopped.
func (q *prepareQueue) push(s *session) bool {
	q.mu.Lock()
	if q.mu.closed || s.queued {
		q.mu.Unlock()
		return false
	}
	s.queued = true
	s.qgen++
	if q.mu.n == len(q.mu.ring) {
		q.growLocked()
	}
	q.mu.ring[(q.mu.head+q.mu.n)%len(q.mu.ring)] = queueEntry{s: s, gen: s.qgen}
	q.mu.n++
	q.mu.live++
	q.mu.Unlock()
	select {
	case q.doorbell <- struct{}{}:
	default:
	}
	return true
}

// growLocked makes room for one more entry: it compacts the ring when
// stale entries are more than the slack allows, and doubles it otherwise.
func (q *prepareQueue) growLocked() {
	if q.mu.n-q.mu.live > q.mu.live+queueSlack {
		q.compactLocked()
		return
	}
	grown := make([]queueEntry, max(2*len(q.mu.ring), 16))
	q.copyLiveLocked(grown, false)
}

// compactLocked drops the stale entries, keeping the live ones in order.
func (q *prepareQueue) compactLocked() {
	q.copyLiveLocked(make([]queueEntry, len(q.mu.ring)), true)
}

// copyLiveLocked copies the ring's entries in order into dst (only the
// live ones if liveOnly) and makes dst the ring.
func (q *prepareQueue) copyLiveLocked(dst []queueEntry, liveOnly bool) {
	k := 0
	for i := range q.mu.n {
		e := q.mu.ring[(q.mu.head+i)%len(q.mu.ring)]
		if liveOnly && !e.live() {
			continue
		}
		dst[k] = e
		k++
	}
	q.mu.ring, q.mu.head, q.mu.n = dst, 0, k
}

// live reports whether e is its session's current entry.
// REQUIRES: the queue's mu held.
func (e queueEntry) live() bool { return e.s.queued && e.s.qgen == e.gen }

// pop removes and returns the oldest session, or nil when empty.
func (q *prepareQueue) pop() *session {
	var dst [1]*session
	if q.popMany(dst[:]) == 0 {
		return nil
	}
	return dst[0]
}

// popMany removes up to len(dst) of the oldest sessions into dst under one
// lock and returns how many.
func (q *prepareQueue) popMany(dst []*session) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n, ahead := 0, 0
	for n < len(dst) && q.mu.live > 0 {
		if ahead == 0 {
			q.touchLocked()
			ahead = touchahead.Chunk
		}
		ahead--
		e := q.takeLocked()
		if !e.live() {
			continue
		}
		e.s.queued = false
		q.mu.live--
		dst[n] = e.s
		n++
	}
	if q.mu.live == 0 {
		q.dropStaleLocked()
	}
	return n
}

// takeLocked removes the oldest entry, live or stale.
func (q *prepareQueue) takeLocked() queueEntry {
	e := q.mu.ring[q.mu.head]
	q.mu.ring[q.mu.head] = queueEntry{} // pins no session
	q.mu.head = (q.mu.head + 1) % len(q.mu.ring)
	q.mu.n--
	return e
}

// dropStaleLocked empties a ring that holds no live entry.
func (q *prepareQueue) dropStaleLocked() {
	for q.mu.n > 0 {
		q.takeLocked()
	}
	q.mu.head = 0
}

// touchLocked reads the queue word of the sessions of the next chunk of
// entries, so that the pops' reads of them miss the caches together
// (internal/touchahead). It changes nothing but a sum q.mu guards.
func (q *prepareQueue) touchLocked() {
	var t uint32
	for i := range min(touchahead.Chunk, q.mu.n) {
		if s := q.mu.ring[(q.mu.head+i)%len(q.mu.ring)].s; s != nil {
			t += s.qgen
		}
	}
	q.mu.touched = t
}

// unlink removes s if it is queued (a removed session must not occupy
// space until a worker pops it): its entry turns stale.
func (q *prepareQueue) unlink(s *session) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if s.queued {
		s.queued = false
		q.mu.live--
		if q.mu.live == 0 {
			q.dropStaleLocked()
		}
	}
}

// len returns the number of queued sessions.
func (q *prepareQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.mu.live
}

// close refuses further pushes and empties the queue.
func (q *prepareQueue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.mu.closed = true
	for q.mu.n > 0 {
		if e := q.takeLocked(); e.live() {
			e.s.queued = false
		}
	}
	q.mu.live, q.mu.head = 0, 0
}

// contains reports whether s is queued here.
func (q *prepareQueue) contains(s *session) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return s.queued
}

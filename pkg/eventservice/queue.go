package eventservice

import "sync"

// prepareQueue is one preparation worker's FIFO of sessions. It is
// intrusive (the links live in the session), so push and unlink are O(1)
// and allocation-free, and a session is in at most one queue at most once:
// the queue's length is bounded by the number of sessions hashed to its
// worker, whatever the notification rate.
//
// INVARIANT: s.qnext/s.qprev/s.queued are guarded by q.mu; s.queued is true
// iff s is linked in q.
type prepareQueue struct {
	mu struct {
		sync.Mutex
		head, tail *session
		n          int
		closed     bool
	}
	// doorbell has capacity one: a push rings it without blocking; the
	// worker drains the whole queue per ring.
	doorbell chan struct{}
}

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
	s.qprev, s.qnext = q.mu.tail, nil
	if q.mu.tail != nil {
		q.mu.tail.qnext = s
	} else {
		q.mu.head = s
	}
	q.mu.tail = s
	q.mu.n++
	q.mu.Unlock()
	select {
	case q.doorbell <- struct{}{}:
	default:
	}
	return true
}

// pop removes and returns the oldest session, or nil when empty.
func (q *prepareQueue) pop() *session {
	q.mu.Lock()
	defer q.mu.Unlock()
	s := q.mu.head
	if s != nil {
		q.unlinkLocked(s)
	}
	return s
}

// popMany removes up to len(dst) of the oldest sessions into dst under one
// lock and returns how many.
func (q *prepareQueue) popMany(dst []*session) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for n < len(dst) && q.mu.head != nil {
		s := q.mu.head
		q.unlinkLocked(s)
		dst[n] = s
		n++
	}
	return n
}

// unlink removes s if it is queued (a removed session must not occupy
// space until a worker pops it).
func (q *prepareQueue) unlink(s *session) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if s.queued {
		q.unlinkLocked(s)
	}
}

func (q *prepareQueue) unlinkLocked(s *session) {
	if s.qprev != nil {
		s.qprev.qnext = s.qnext
	} else {
		q.mu.head = s.qnext
	}
	if s.qnext != nil {
		s.qnext.qprev = s.qprev
	} else {
		q.mu.tail = s.qprev
	}
	s.qprev, s.qnext, s.queued = nil, nil, false
	q.mu.n--
}

// len returns the number of queued sessions.
func (q *prepareQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.mu.n
}

// close refuses further pushes and empties the queue.
func (q *prepareQueue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.mu.closed = true
	for q.mu.head != nil {
		q.unlinkLocked(q.mu.head)
	}
}

// contains reports whether s is queued here.
func (q *prepareQueue) contains(s *session) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return s.queued
}

package pendingset

import "fmt"

// state is where a key is in its life inside the set. Only the transition
// methods in this file assign node.state, and each keeps the per-state
// counts in Set.mu.count exact.
//
//	absent|idle --Add--> ready --Drain--> in-flight --Complete--> idle | ready | backoff | quarantined
//	backoff --due (or Add + Bypass)--> ready
//	quarantined --QuarantineRetry elapsed--> ready
//	idle --slot taken by a new key--> absent
//
// "In flight and dirty" is stateInFlight with node.dirty set: a value was
// added while the previous one was being delivered.
type state uint8

const (
	// stateIdle: delivered, nothing pending. The key stays mapped so that
	// adding it again costs a map hit instead of an insert and a delete;
	// the node is on the idle list and is the first to be repurposed for a
	// new key. Idle keys are not "held": Len does not count them.
	stateIdle state = iota
	// stateReady: in the ready FIFO; val holds the undelivered value.
	stateReady
	// stateInFlight: handed out by Drain and not yet completed; val holds a
	// value only when dirty.
	stateInFlight
	// stateBackoff: in the due heap after a per-key failure; val holds the
	// value to retry.
	stateBackoff
	// stateQuarantined: in the due heap, waiting QuarantineRetry after
	// exhausting MaxAttempts; val holds the value to retry.
	stateQuarantined

	numStates
)

func (s state) String() string {
	switch s {
	case stateIdle:
		return "idle"
	case stateReady:
		return "ready"
	case stateInFlight:
		return "in-flight"
	case stateBackoff:
		return "backoff"
	case stateQuarantined:
		return "quarantined"
	default:
		return fmt.Sprintf("state(%d)", uint8(s))
	}
}

// none is the null node index.
const none int32 = -1

// node is one key's slot. Nodes live in Set.mu.nodes and are addressed by
// int32 index, so the ready FIFO, the idle list and the due heap are
// intrusive and cost no allocation once the slice has grown to the peak
// number of distinct keys held. Without pointers in K and V the slice is
// not even scanned by the GC.
//
// INVARIANT: every node's key is in the index, pointing at it, and the
// node is in exactly one of: the idle list (stateIdle), the ready FIFO
// (stateReady), the due heap (stateBackoff, stateQuarantined), or none of
// them (stateInFlight). The slice only grows when no node is idle, so
// len(nodes) == len(index) <= peak number of keys held at once.
type node[K comparable, V any] struct {
	key K
	// val is the undelivered value. Valid in ready, backoff and quarantined,
	// and in flight when dirty; zeroed otherwise so it pins no memory.
	val V
	// since is when the earliest add merged into val happened (clock
	// nanoseconds since Set.base), for the first-add-to-drain latency;
	// noStamp when that add was not sampled.
	since int64
	// due is when a backing-off or quarantined key becomes ready again.
	due int64
	// token identifies the Drain call that handed the node out, so a stale
	// or repeated Complete cannot complete a later delivery.
	token uint64
	// attempts counts budgeted (per-key) failures since the last success.
	attempts int32
	// transient counts unbudgeted per-key retries since the last success;
	// it only sizes their backoff.
	transient int32
	// next links the ready FIFO or the idle list; prev the idle list.
	next, prev int32
	// heapIdx is the node's position in the due heap, or none.
	heapIdx int32
	state   state
	// dirty: in flight, and a newer value has been added to val.
	dirty bool
}

// --- transitions. REQUIRES: s.mu held for all of them. ---

// setStateLocked moves node i to state to, keeping the counts exact.
func (s *Set[K, V]) setStateLocked(i int32, to state) {
	n := &s.mu.nodes[i]
	s.mu.count[n.state]--
	s.mu.count[to]++
	n.state = to
}

// heldLocked is the number of keys held (not idle).
func (s *Set[K, V]) heldLocked() int { return len(s.mu.nodes) - s.mu.count[stateIdle] }

// insertLocked gives a key that is not mapped a node, repurposing the
// longest-idle one if any (its key is forgotten) and growing the slice
// otherwise, and makes it ready at the FIFO's tail. absent -> ready.
func (s *Set[K, V]) insertLocked(k K, v V, since int64) {
	i := s.mu.idleHead
	if i != none {
		s.unidleLocked(i)
		delete(s.mu.index, s.mu.nodes[i].key)
		if int(i) < len(s.mu.delivered) {
			s.mu.delivered[i] = lastDelivered[V]{} // another key's slot now
		}
	} else {
		i = int32(len(s.mu.nodes))
		s.mu.nodes = append(s.mu.nodes, node[K, V]{state: stateIdle})
		s.mu.count[stateIdle]++
	}
	s.mu.nodes[i] = node[K, V]{key: k, val: v, since: since, heapIdx: none, next: none, prev: none, state: stateIdle}
	s.mu.index[k] = i
	s.readyLocked(i, false)
}

// reviveLocked makes idle node i ready again with value v. idle -> ready.
func (s *Set[K, V]) reviveLocked(i int32, v V, since int64) {
	s.unidleLocked(i)
	n := &s.mu.nodes[i]
	n.val, n.since = v, since
	s.readyLocked(i, false)
}

// readyLocked appends node i to the ready FIFO (or prepends it, for keys
// returned by a whole-batch failure, which were pending before anything
// now queued). idle|in-flight|backoff|quarantined -> ready. An idle node
// must already be off the idle list.
func (s *Set[K, V]) readyLocked(i int32, front bool) {
	n := &s.mu.nodes[i]
	if n.heapIdx != none {
		s.heapRemoveLocked(i)
	}
	wasIdle := n.state == stateIdle
	s.setStateLocked(i, stateReady)
	if wasIdle {
		if h := s.heldLocked(); h > s.mu.maxLen {
			s.mu.maxLen = h
		}
	}
	n.next = none
	switch {
	case s.mu.head == none:
		s.mu.head, s.mu.tail = i, i
	case front:
		n.next = s.mu.head
		s.mu.head = i
	default:
		s.mu.nodes[s.mu.tail].next = i
		s.mu.tail = i
	}
}

// idleLocked retires a delivered node to the idle list's tail, keeping
// its key mapped. in-flight -> idle.
func (s *Set[K, V]) idleLocked(i int32) {
	s.setStateLocked(i, stateIdle)
	n := &s.mu.nodes[i]
	var zero V
	n.val, n.since, n.attempts, n.transient, n.dirty = zero, 0, 0, 0, false
	n.next, n.prev = none, s.mu.idleTail
	if s.mu.idleTail == none {
		s.mu.idleHead = i
	} else {
		s.mu.nodes[s.mu.idleTail].next = i
	}
	s.mu.idleTail = i
}

// unidleLocked unlinks idle node i from the idle list; its state stays
// stateIdle until the caller's next transition.
func (s *Set[K, V]) unidleLocked(i int32) {
	n := &s.mu.nodes[i]
	if n.prev == none {
		s.mu.idleHead = n.next
	} else {
		s.mu.nodes[n.prev].next = n.next
	}
	if n.next == none {
		s.mu.idleTail = n.prev
	} else {
		s.mu.nodes[n.next].prev = n.prev
	}
	n.next, n.prev = none, none
}

// popReadyLocked removes the FIFO's head, marks it in flight under the
// given drain token and returns its entry. ready -> in-flight.
// REQUIRES: the FIFO is not empty.
func (s *Set[K, V]) popReadyLocked(token uint64, now int64) Entry[K, V] {
	i := s.mu.head
	n := &s.mu.nodes[i]
	s.mu.head = n.next
	if s.mu.head == none {
		s.mu.tail = none
	}
	e := Entry[K, V]{Key: n.key, Value: n.val, Attempts: int(n.attempts), idx: i, token: token, since: n.since, drained: now}
	var zero V
	n.val, n.next, n.token, n.dirty = zero, none, token, false
	s.setStateLocked(i, stateInFlight)
	return e
}

// waitLocked parks node i in the due heap until due. to is stateBackoff or
// stateQuarantined. in-flight -> backoff | quarantined.
func (s *Set[K, V]) waitLocked(i int32, to state, due int64) {
	s.setStateLocked(i, to)
	s.mu.nodes[i].due = due
	s.heapPushLocked(i)
}

// --- the due heap: a binary min-heap of node indexes ordered by (due, index). ---

func (s *Set[K, V]) heapLessLocked(a, b int32) bool {
	da, db := s.mu.nodes[a].due, s.mu.nodes[b].due
	return da < db || (da == db && a < b)
}

func (s *Set[K, V]) heapSwapLocked(x, y int) {
	h := s.mu.heap
	h[x], h[y] = h[y], h[x]
	s.mu.nodes[h[x]].heapIdx = int32(x)
	s.mu.nodes[h[y]].heapIdx = int32(y)
}

func (s *Set[K, V]) heapUpLocked(j int) {
	for j > 0 {
		p := (j - 1) / 2
		if !s.heapLessLocked(s.mu.heap[j], s.mu.heap[p]) {
			return
		}
		s.heapSwapLocked(j, p)
		j = p
	}
}

func (s *Set[K, V]) heapDownLocked(j int) {
	n := len(s.mu.heap)
	for {
		l := 2*j + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && s.heapLessLocked(s.mu.heap[r], s.mu.heap[l]) {
			m = r
		}
		if !s.heapLessLocked(s.mu.heap[m], s.mu.heap[j]) {
			return
		}
		s.heapSwapLocked(j, m)
		j = m
	}
}

func (s *Set[K, V]) heapPushLocked(i int32) {
	s.mu.heap = append(s.mu.heap, i)
	j := len(s.mu.heap) - 1
	s.mu.nodes[i].heapIdx = int32(j)
	s.heapUpLocked(j)
}

// heapRemoveLocked removes node i from the heap. REQUIRES: i is in it.
func (s *Set[K, V]) heapRemoveLocked(i int32) {
	j := int(s.mu.nodes[i].heapIdx)
	last := len(s.mu.heap) - 1
	if j != last {
		s.heapSwapLocked(j, last)
	}
	s.mu.heap = s.mu.heap[:last]
	s.mu.nodes[i].heapIdx = none
	if j != last {
		s.heapDownLocked(j)
		s.heapUpLocked(j)
	}
}

package pendingset

import "fmt"

// state is where a key is in its life inside the set. Only the transition
// methods in this file assign node.state, and each keeps the per-state
// counts in Set.mu.count exact.
//
//	absent --Add--> ready --Drain--> in-flight --Complete--> absent | ready | backoff | quarantined
//	backoff --due (or Add + Bypass)--> ready
//	quarantined --QuarantineRetry elapsed--> ready
//
// "In flight and dirty" is stateInFlight with node.dirty set: a value was
// added while the previous one was being delivered.
type state uint8

const (
	// stateFree: the node is on the free list and in no index entry.
	stateFree state = iota
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
	case stateFree:
		return "free"
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
// int32 index, so the ready FIFO, the free list and the due heap are
// intrusive and cost no allocation once the slice has grown to the peak
// number of distinct keys. Without pointers in K and V the slice is not
// even scanned by the GC.
//
// INVARIANT: a node is in exactly one of: the free list (stateFree), the
// ready FIFO (stateReady), the due heap (stateBackoff, stateQuarantined),
// or none of them (stateInFlight). Every non-free node has an index entry.
type node[K comparable, V any] struct {
	key K
	// val is the undelivered value. Valid in ready, backoff and quarantined,
	// and in flight when dirty; zeroed otherwise so it pins no memory.
	val V
	// since is when the earliest add merged into val happened (clock
	// nanoseconds since Set.base), for the first-add-to-drain latency.
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
	// next links the ready FIFO or the free list.
	next int32
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

// insertLocked takes a free node (or grows the slice) for a new key and
// makes it ready at the FIFO's tail. absent -> ready.
func (s *Set[K, V]) insertLocked(k K, v V, now int64) {
	i := s.mu.free
	if i != none {
		s.mu.free = s.mu.nodes[i].next
	} else {
		i = int32(len(s.mu.nodes))
		s.mu.nodes = append(s.mu.nodes, node[K, V]{})
		s.mu.count[stateFree]++
	}
	n := &s.mu.nodes[i]
	*n = node[K, V]{key: k, val: v, since: now, heapIdx: none, next: none, state: stateFree}
	s.mu.index[k] = i
	if l := len(s.mu.index); l > s.mu.maxLen {
		s.mu.maxLen = l
	}
	s.readyLocked(i, false)
}

// readyLocked appends node i to the ready FIFO (or prepends it, for keys
// returned by a whole-batch failure, which were pending before anything
// now queued). free|in-flight|backoff|quarantined -> ready.
func (s *Set[K, V]) readyLocked(i int32, front bool) {
	n := &s.mu.nodes[i]
	if n.heapIdx != none {
		s.heapRemoveLocked(i)
	}
	s.setStateLocked(i, stateReady)
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
	e := Entry[K, V]{Key: n.key, Value: n.val, Attempts: int(n.attempts), token: token, since: n.since, drained: now}
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

// freeLocked forgets node i's key and puts the node on the free list.
// in-flight -> absent.
func (s *Set[K, V]) freeLocked(i int32) {
	n := &s.mu.nodes[i]
	delete(s.mu.index, n.key)
	s.setStateLocked(i, stateFree)
	*n = node[K, V]{next: s.mu.free, heapIdx: none, state: stateFree}
	s.mu.free = i
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

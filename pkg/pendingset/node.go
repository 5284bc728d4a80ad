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

// node is a key's cold bookkeeping (its slot holds the hot data): its
// link in the ready FIFO, and its retry and delivery state. Nodes live in
// Set.mu.nodes and are addressed by int32 index, which never changes while
// the key is held, so entries, the ready FIFO,
// the idle queue and the due heap refer to nodes; the FIFO and the heap
// are intrusive and the idle queue is a slice of indexes, so nothing
// allocates once the slices have grown to the peak number of distinct
// keys held. Without pointers in K and V the slices are not even scanned
// by the GC.
//
// INVARIANT: node i and slot i are one key's, which exactly one index
// entry maps to i; the node is in exactly one of: the idle queue (stateIdle;
// exactly one live entry), the ready FIFO (stateReady), the due heap
// (stateBackoff, stateQuarantined), or none of them (stateInFlight). The
// node and slot slices only grow when no node is idle, so len(nodes) ==
// len(slots) == index entries used <= peak number of keys held at once.
type node struct {
	// since is when the earliest add merged into the value happened (clock
	// nanoseconds since Set.base), for the first-add-to-drain latency;
	// valid only while the slot is stamped.
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
	// heapIdx is the node's position in the due heap, or none.
	heapIdx int32
	// idleGen counts the node's moves to idle; the idle queue entry that
	// carries the current count is the live one (see idleEntry). It is
	// never reset, not even when the node changes keys, so an old entry
	// cannot come back to life.
	idleGen uint32
}

// idleEntry is one entry of the idle queue: node idx went idle for the
// gen-th time. It is live while the node is still idle with that count;
// a node revived by Add leaves its entry behind, stale, rather than
// unlinking it, which would touch two random neighbours per Add.
type idleEntry struct {
	idx int32
	gen uint32
}

// --- transitions. REQUIRES: s.mu held for all of them. sl is always the
// node's own slot, passed in so that the hot path need not read the node
// to find it. ---

// setStateLocked moves the key of slot sl to state to, keeping the counts
// exact.
func (s *Set[K, V]) setStateLocked(sl *slot[K, V], to state) {
	s.mu.count[sl.state]--
	s.mu.count[to]++
	sl.state = to
}

// heldLocked is the number of keys held (not idle).
func (s *Set[K, V]) heldLocked() int { return len(s.mu.nodes) - s.mu.count[stateIdle] }

// insertLocked gives a key that is not held a node and a slot, repurposing
// the longest-idle node if any (its key is forgotten) and growing the node
// slice otherwise, and makes it ready at the FIFO's tail. absent -> ready.
func (s *Set[K, V]) insertLocked(k K, v V, since int64) {
	i, ok := s.popIdleLocked()
	if ok {
		s.unindexLocked(i)
		if int(i) < len(s.mu.delivered) {
			s.mu.delivered[i] = lastDelivered[V]{} // another key's node now
		}
		n := &s.mu.nodes[i]
		n.due, n.token, n.attempts, n.transient = 0, 0, 0, 0
	} else {
		i = int32(len(s.mu.nodes))
		s.mu.nodes = append(s.mu.nodes, node{heapIdx: none})
		s.mu.slots = append(s.mu.slots, slot[K, V]{})
		s.mu.count[stateIdle]++ // the new slot starts idle
	}
	s.indexLocked(k, i)
	sl := &s.mu.slots[i]
	*sl = slot[K, V]{key: k, val: v, state: stateIdle}
	s.setSinceLocked(i, sl, since)
	s.readyLocked(i, sl, false)
}

// reviveLocked makes idle node i ready again with value v. idle -> ready.
// Its idle queue entry goes stale.
func (s *Set[K, V]) reviveLocked(i int32, sl *slot[K, V], v V, since int64) {
	sl.val = v
	s.setSinceLocked(i, sl, since)
	s.readyLocked(i, sl, false)
}

// readyLocked appends node i to the ready FIFO (or prepends it, for keys
// returned by a whole-batch failure, which were pending before anything
// now queued). idle|in-flight|backoff|quarantined -> ready.
func (s *Set[K, V]) readyLocked(i int32, sl *slot[K, V], front bool) {
	from := sl.state
	if from == stateBackoff || from == stateQuarantined {
		s.heapRemoveLocked(i)
	}
	s.setStateLocked(sl, stateReady)
	if from == stateIdle {
		if held := s.heldLocked(); held > s.mu.maxLen {
			s.mu.maxLen = held
		}
	}
	s.mu.ready.push(i, front)
}

// idleLocked retires a delivered node to the idle queue's tail, keeping
// its key held. in-flight -> idle.
func (s *Set[K, V]) idleLocked(i int32, sl *slot[K, V]) {
	s.setStateLocked(sl, stateIdle)
	var zero V
	sl.val, sl.stamped, sl.dirty = zero, false, false
	n := &s.mu.nodes[i]
	n.attempts, n.transient = 0, 0
	n.idleGen++
	s.mu.idle = append(s.mu.idle, idleEntry{idx: i, gen: n.idleGen})
	// Stale entries are dropped when they outnumber what can be live by
	// half: a compaction costs O(queue) and follows at least len(nodes)/2
	// pushes, so it is O(1) amortised, and the queue stays below
	// 1.5*len(nodes)+64 < 2^32 entries, so a stale entry never lives long
	// enough for its node's uint32 count to come round to it again.
	if queued := len(s.mu.idle) - s.mu.idleHead; queued > len(s.mu.nodes)+len(s.mu.nodes)/2+64 {
		s.compactIdleLocked()
	}
}

// idleLiveLocked reports whether idle queue entry e is live.
func (s *Set[K, V]) idleLiveLocked(e idleEntry) bool {
	return s.mu.nodes[e.idx].idleGen == e.gen && s.slotLocked(e.idx).state == stateIdle
}

// popIdleLocked removes and returns the longest-idle node, skipping stale
// entries; false if no node is idle.
func (s *Set[K, V]) popIdleLocked() (int32, bool) {
	if s.mu.count[stateIdle] == 0 {
		// Every entry is stale: drop them all.
		s.mu.idle, s.mu.idleHead = s.mu.idle[:0], 0
		return none, false
	}
	for {
		e := s.mu.idle[s.mu.idleHead]
		s.mu.idleHead++
		if s.idleLiveLocked(e) {
			if s.mu.idleHead > len(s.mu.idle)/2 {
				s.compactIdleLocked()
			}
			return e.idx, true
		}
	}
}

// compactIdleLocked drops the consumed prefix and the stale entries of the
// idle queue, keeping the live ones in order.
func (s *Set[K, V]) compactIdleLocked() {
	q := s.mu.idle[:0]
	for _, e := range s.mu.idle[s.mu.idleHead:] {
		if s.idleLiveLocked(e) {
			q = append(q, e)
		}
	}
	s.mu.idle, s.mu.idleHead = q, 0
}

// popReadyLocked removes the FIFO's head, marks it in flight under the
// given drain token and returns its entry. ready -> in-flight.
// REQUIRES: the FIFO is not empty.
func (s *Set[K, V]) popReadyLocked(token uint64, now int64) Entry[K, V] {
	i := s.mu.ready.pop()
	n := &s.mu.nodes[i]
	sl := &s.mu.slots[i]
	e := Entry[K, V]{Key: sl.key, Value: sl.val, Attempts: int(n.attempts), idx: i, token: token, since: s.sinceLocked(i, sl), drained: now}
	var zero V
	sl.val, sl.dirty = zero, false
	n.token = token
	s.setStateLocked(sl, stateInFlight)
	return e
}

// waitLocked parks node i in the due heap until due. to is stateBackoff or
// stateQuarantined. in-flight -> backoff | quarantined.
func (s *Set[K, V]) waitLocked(i int32, sl *slot[K, V], to state, due int64) {
	s.setStateLocked(sl, to)
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

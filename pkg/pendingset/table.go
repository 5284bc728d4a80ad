package pendingset

import "hash/maphash"

// The set's index is its own open-addressing hash table (linear probing,
// backward-shift deletion, power-of-two size, at most 7/8 full) whose
// slots hold, next to the key, everything Add reads and writes: the value
// and the key's state. Adding to a key that is already
// held therefore costs one cache miss, on a slot that usually shares its
// cache line with the key's home position; with Go's map the key's group
// control word, its slot and a separate node were up to three. With 100k
// keys visited in random order that was the difference between ~320 and
// ~100 ns per Add (scripts/wqbench).
//
// A slot moves when the table grows and when a deletion shifts its
// cluster back, so nothing refers to slots by position except the node
// that owns one (node.slot), which every move updates. Entries, the ready
// FIFO, the idle queue and the due heap refer to nodes, which never move.

// slot is one position of the index. ref == 0 marks an empty position, so
// a freshly allocated table is all empty.
type slot[K comparable, V any] struct {
	key K
	// val is the undelivered value. Valid in ready, backoff and quarantined,
	// and in flight when dirty; zeroed otherwise so it pins no memory.
	val V
	// ref is the owning node's index + 1.
	ref   int32
	state state
	// dirty: in flight, and a newer value has been added to val.
	dirty bool
	// stamped: the earliest add merged into val was sampled for the
	// first-add-to-drain latency, and node.since says when. One add in
	// latencySampleEvery is, so the time lives in the node and the slot
	// stays at 32 bytes for 16-byte keys and 8-byte values.
	stamped bool
}

// minTableSize is the table's size when the first key arrives.
const minTableSize = 8

// The table grows when a new key would take it past maxLoadNum/maxLoadDen
// full. 7/8, as Go's maps: with 32-byte slots the table is then as small
// as a map[K]struct{} of the same keys, and what decides the cost of a
// lookup at 100k keys is whether the table stays in the last-level cache
// (at 3/4, 100k keys needed 262,144 slots, 8 MB, and an Add cost ~195 ns;
// workqueue's map, 2-4 MB, ~100 ns). Probe sequences grow (2.5 slots on
// average for a hit, mostly in one or two adjacent cache lines).
const (
	maxLoadNum = 7
	maxLoadDen = 8
)

// setSinceLocked records since as the first add of node i's value (slot
// sl); noStamp means it was not sampled.
func (s *Set[K, V]) setSinceLocked(i int32, sl *slot[K, V], since int64) {
	sl.stamped = since != noStamp
	if sl.stamped {
		s.mu.nodes[i].since = since
	}
}

// sinceLocked is when node i's value (slot sl) was first added, or noStamp.
func (s *Set[K, V]) sinceLocked(i int32, sl *slot[K, V]) int64 {
	if !sl.stamped {
		return noStamp
	}
	return s.mu.nodes[i].since
}

// homeLocked is k's home position. REQUIRES: the table is not empty.
func (s *Set[K, V]) homeLocked(k K) int32 {
	return int32(maphash.Comparable(s.seed, k) & uint64(len(s.mu.slots)-1))
}

// findLocked returns the position of k's slot, or false if k is not held.
func (s *Set[K, V]) findLocked(k K) (int32, bool) {
	if len(s.mu.slots) == 0 {
		return none, false
	}
	mask := int32(len(s.mu.slots) - 1)
	for p := s.homeLocked(k); ; p = (p + 1) & mask {
		sl := &s.mu.slots[p]
		if sl.ref == 0 {
			return none, false
		}
		if sl.key == k {
			return p, true
		}
	}
}

// slotLocked is node i's slot.
func (s *Set[K, V]) slotLocked(i int32) *slot[K, V] { return &s.mu.slots[s.mu.nodes[i].slot] }

// putSlotLocked gives node i a slot for k, which must not be held, in
// state idle with no value, growing the table if it would pass maxLoad.
// Pointers to slots taken before the call are invalid after it.
func (s *Set[K, V]) putSlotLocked(k K, i int32) *slot[K, V] {
	if (s.mu.used+1)*maxLoadDen > len(s.mu.slots)*maxLoadNum {
		s.growLocked()
	}
	mask := int32(len(s.mu.slots) - 1)
	p := s.homeLocked(k)
	for s.mu.slots[p].ref != 0 {
		p = (p + 1) & mask
	}
	s.mu.used++
	s.mu.nodes[i].slot = p
	sl := &s.mu.slots[p]
	*sl = slot[K, V]{key: k, ref: i + 1, state: stateIdle}
	return sl
}

// dropSlotLocked empties position p and shifts the rest of its cluster
// back, so that lookups need no tombstones. Pointers to slots taken before
// the call are invalid after it.
func (s *Set[K, V]) dropSlotLocked(p int32) {
	mask := int32(len(s.mu.slots) - 1)
	s.mu.used--
	for q := (p + 1) & mask; s.mu.slots[q].ref != 0; q = (q + 1) & mask {
		// The slot at q may fill the hole at p if p lies on its probe path,
		// from its home to q.
		if home := s.homeLocked(s.mu.slots[q].key); (q-home)&mask >= (q-p)&mask {
			s.mu.slots[p] = s.mu.slots[q]
			s.mu.nodes[s.mu.slots[p].ref-1].slot = p
			p = q
		}
	}
	s.mu.slots[p] = slot[K, V]{}
}

// growLocked doubles the table (or creates it) and re-places every slot.
func (s *Set[K, V]) growLocked() {
	old := s.mu.slots
	s.mu.slots = make([]slot[K, V], max(minTableSize, 2*len(old)))
	mask := int32(len(s.mu.slots) - 1)
	for j := range old {
		if old[j].ref == 0 {
			continue
		}
		p := s.homeLocked(old[j].key)
		for s.mu.slots[p].ref != 0 {
			p = (p + 1) & mask
		}
		s.mu.slots[p] = old[j]
		s.mu.nodes[old[j].ref-1].slot = p
	}
}

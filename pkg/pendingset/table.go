package pendingset

// A key's data lives in two dense slices indexed by its node number: the
// hot slot (key, value, state: everything Add reads and writes) and the
// cold node (FIFO link, retry and delivery bookkeeping). Node numbers are
// handed out in the order keys first arrive and never change while a key
// is held, so a key stream that visits keys in a stable order (the usual
// case: dispatchers advance in the order they were registered, round
// after round) walks both slices sequentially, and so does Drain, which
// pops the FIFO in the order keys became ready.
//
// The index maps a key to its node number. It is its own open-addressing
// hash table (linear probing, backward-shift deletion, power-of-two size,
// at most 7/8 full) of 8-byte entries, eight to a cache line: the low 32
// bits of the key's hash (its tag) next to node number + 1 (0 marks an
// empty entry). The tag gives the entry's home position (tag & mask), so
// growing the table and shifting a cluster back after a deletion never
// read a key, and it filters probes, so a lookup compares keys (reads a
// slot) almost only on the entry that holds the key. At 100k keys the
// index is 1 MB and stays in cache: an Add to a held key visited in random
// order costs one miss, on its slot; in a stable order, none. Go's map
// (the first version) cost a miss for the group's control word, one for
// the entry and one for the node (docs/design/pendingset.md has the
// measured steps).

// slot is a key's hot data; s.mu.slots[i] belongs to node i.
type slot[K comparable, V any] struct {
	key K
	// val is the undelivered value. Valid in ready, backoff and quarantined,
	// and in flight when dirty; zeroed otherwise so it pins no memory.
	val   V
	state state
	// dirty: in flight, and a newer value has been added to val.
	dirty bool
	// stamped: the earliest add merged into val was sampled for the
	// first-add-to-drain latency, and node.since says when. One add in
	// latencySampleEvery is, so the time lives in the cold node.
	stamped bool
}

// minTableSize is the index's size when the first key arrives.
const minTableSize = 8

// The index grows when a new key would take it past maxLoadNum/maxLoadDen
// full (7/8, as Go's maps). Its entries are 8 bytes, so even at the
// largest load a probe sequence (2.5 entries on average for a hit) rarely
// leaves one cache line.
const (
	maxLoadNum = 7
	maxLoadDen = 8
)

// entry packs a tag and a node number + 1 into one index entry.
func entry(tag uint32, i int32) uint64 { return uint64(tag)<<32 | uint64(uint32(i+1)) }

// entryNode is the node number an entry refers to; none for an empty one.
func entryNode(e uint64) int32 { return int32(uint32(e)) - 1 }

// entryTag is the tag of an entry.
func entryTag(e uint64) uint32 { return uint32(e >> 32) }

// tagLocked is k's tag: the low 32 bits of its hash.
func (s *Set[K, V]) tagLocked(k K) uint32 { return uint32(s.hasher.hash(&k)) }

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

// findLocked returns k's node number, or false if k is not held.
func (s *Set[K, V]) findLocked(k K) (int32, bool) {
	if len(s.mu.index) == 0 {
		return none, false
	}
	tag := s.tagLocked(k)
	mask := uint32(len(s.mu.index) - 1)
	for p := tag & mask; ; p = (p + 1) & mask {
		e := s.mu.index[p]
		if e == 0 {
			return none, false
		}
		if entryTag(e) == tag {
			if i := entryNode(e); s.mu.slots[i].key == k {
				return i, true
			}
		}
	}
}

// slotLocked is node i's slot.
func (s *Set[K, V]) slotLocked(i int32) *slot[K, V] { return &s.mu.slots[i] }

// indexLocked maps k, which must not be held, to node i, growing the
// index if it would pass maxLoad.
func (s *Set[K, V]) indexLocked(k K, i int32) {
	if (s.mu.used+1)*maxLoadDen > len(s.mu.index)*maxLoadNum {
		s.growLocked()
	}
	s.placeLocked(entry(s.tagLocked(k), i))
	s.mu.used++
}

// placeLocked puts e at the first empty position from its home.
func (s *Set[K, V]) placeLocked(e uint64) {
	mask := uint32(len(s.mu.index) - 1)
	p := entryTag(e) & mask
	for s.mu.index[p] != 0 {
		p = (p + 1) & mask
	}
	s.mu.index[p] = e
}

// unindexLocked removes node i's key (slot i) from the index and shifts
// the rest of its cluster back, so that lookups need no tombstones.
func (s *Set[K, V]) unindexLocked(i int32) {
	mask := uint32(len(s.mu.index) - 1)
	want := entry(s.tagLocked(s.mu.slots[i].key), i)
	p := entryTag(want) & mask
	for s.mu.index[p] != want {
		p = (p + 1) & mask
	}
	s.mu.used--
	for q := (p + 1) & mask; s.mu.index[q] != 0; q = (q + 1) & mask {
		// The entry at q may fill the hole at p if p lies on its probe path,
		// from its home to q.
		if home := entryTag(s.mu.index[q]) & mask; (q-home)&mask >= (q-p)&mask {
			s.mu.index[p] = s.mu.index[q]
			p = q
		}
	}
	s.mu.index[p] = 0
}

// growLocked doubles the index (or creates it) and re-places every entry
// by its tag; no key is read.
func (s *Set[K, V]) growLocked() {
	old := s.mu.index
	s.mu.index = make([]uint64, max(minTableSize, 2*len(old)))
	for _, e := range old {
		if e != 0 {
			s.placeLocked(e)
		}
	}
}

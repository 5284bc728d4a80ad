package pendingset

// touchChunk is how many keys AddMany touches ahead of adding them: the
// chunk of the project's internal/touchahead, which this standalone
// package does not import.
const touchChunk = 32

// touchAheadLocked reads, changing nothing, what adding a chunk of keys
// will read first: the index entry at each key's home position and, for
// as many idle nodes as inserts could repurpose, the node, its slot and
// the index entry of the key it forgets. With a million distinct keys
// visited in random order (a million dispatchers' resolved-ts) each of
// those is a cache miss, taken one at a time by the adds, which lock,
// compare and branch; touched together first, the misses overlap. The sum
// goes to s.mu.touched so the compiler keeps the reads.
// REQUIRES: s.mu held.
func (s *Set[K, V]) touchAheadLocked(keys []K) {
	if len(s.mu.index) == 0 {
		return
	}
	mask := uint32(len(s.mu.index) - 1)
	var t uint64
	for i := range keys {
		t += s.mu.index[s.tagLocked(keys[i])&mask]
	}
	end := min(s.mu.idleHead+len(keys), len(s.mu.idle))
	for _, e := range s.mu.idle[s.mu.idleHead:end] {
		if int(e.idx) >= len(s.mu.slots) {
			continue
		}
		t += uint64(s.mu.nodes[e.idx].idleGen)
		t += s.mu.index[s.tagLocked(s.mu.slots[e.idx].key)&mask]
	}
	s.mu.touched = t
}

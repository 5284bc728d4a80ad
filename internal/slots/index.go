package slots

import (
	"iter"
	"math/rand/v2"
)

// Key is what an Index maps: a comparable value that hashes itself under
// a seed. The seed is the index's own, drawn at random, so that keys a
// peer chose (a dispatcher ID from the network) cannot be made to collide
// on purpose.
type Key interface {
	comparable
	SeededHash(seed uint64) uint64
}

// Keyed is what an Index holds: an item that knows its key. The index
// keeps no copy of the keys; it asks the item, and only when a bucket's
// fingerprint already matches.
type Keyed[K any] interface {
	comparable
	SlotKey() K
}

// Map maps keys to slots of a table its owner keeps. Its hash table
// holds, per key, one 8-byte bucket: 32 bits of the key's hash (the
// fingerprint, which also places the bucket) and the slot. It keeps no
// copy of the keys: the methods that probe take keyAt, which returns the
// key of the item in a slot the map holds, and ask it only when a
// bucket's fingerprint already matches.
//
// Why not a Go map of keys to slots (what this was): it stores the keys,
// which every item already holds, a second time, in larger buckets; a key
// holding a string made the collector scan the whole map at every cycle.
// The buckets here hold no pointers, so the collector does not scan them.
//
// The table is open-addressed with linear probing, at most three quarters
// full, and a removal shifts the buckets after it back (no tombstones, so
// a table that churns does not fill with them). Map does no locking (its
// owner's lock guards it). The zero value is empty and ready.
type Map[K Key] struct {
	// buckets[i] is fingerprint<<32 | slot; slot 0 (never given) marks an
	// empty bucket. len(buckets) is zero or a power of two.
	buckets []uint64
	seed    uint64
	n       int
}

// maxLoadNum/maxLoadDen is the most of its buckets the table fills before
// it doubles.
const (
	maxLoadNum = 3
	maxLoadDen = 4
	minBuckets = 8
)

// bucketsFor returns the bucket count that holds n keys within the load.
func bucketsFor(n int) int {
	b := minBuckets
	for b*maxLoadNum/maxLoadDen < n {
		b *= 2
	}
	return b
}

// Reserve makes room for n keys without growing the table (a size hint).
func (m *Map[K]) Reserve(n int) {
	if b := bucketsFor(n); b > len(m.buckets) {
		m.rehash(b)
	}
}

// rehash moves every bucket into a table of b buckets. The fingerprint is
// the hash's low 32 bits, so a bucket is placed again without asking for
// its key.
func (m *Map[K]) rehash(b int) {
	if m.buckets == nil {
		m.seed = rand.Uint64()
	}
	old := m.buckets
	m.buckets = make([]uint64, b)
	mask := uint32(b - 1)
	for _, e := range old {
		if uint32(e) == 0 {
			continue
		}
		i := uint32(e>>32) & mask
		for m.buckets[i] != 0 {
			i = (i + 1) & mask
		}
		m.buckets[i] = e
	}
}

// find returns the index of k's bucket and true, or the index of the
// empty bucket that ends k's probe and false; fp is k's fingerprint. The
// table must not be empty.
func (m *Map[K]) find(k K, fp uint32, keyAt func(uint32) K) (uint32, bool) {
	mask := uint32(len(m.buckets) - 1)
	for i := fp & mask; ; i = (i + 1) & mask {
		e := m.buckets[i]
		if uint32(e) == 0 {
			return i, false
		}
		if uint32(e>>32) == fp && keyAt(uint32(e)) == k {
			return i, true
		}
	}
}

// Get returns the slot k maps to.
func (m *Map[K]) Get(k K, keyAt func(uint32) K) (uint32, bool) {
	if m.n == 0 {
		return 0, false
	}
	i, ok := m.find(k, uint32(k.SeededHash(m.seed)), keyAt)
	if !ok {
		return 0, false
	}
	return uint32(m.buckets[i]), true
}

// Set maps k to slot s (not 0), in place of any slot it mapped to.
func (m *Map[K]) Set(k K, s uint32, keyAt func(uint32) K) {
	if (m.n+1)*maxLoadDen > len(m.buckets)*maxLoadNum {
		m.rehash(max(minBuckets, 2*len(m.buckets)))
	}
	fp := uint32(k.SeededHash(m.seed))
	i, found := m.find(k, fp, keyAt)
	m.buckets[i] = uint64(fp)<<32 | uint64(s)
	if !found {
		m.n++
	}
}

// Delete unmaps k and returns the slot it mapped to.
func (m *Map[K]) Delete(k K, keyAt func(uint32) K) (uint32, bool) {
	if m.n == 0 {
		return 0, false
	}
	i, ok := m.find(k, uint32(k.SeededHash(m.seed)), keyAt)
	if !ok {
		return 0, false
	}
	s := uint32(m.buckets[i])
	m.deleteBucket(i)
	m.n--
	return s, true
}

// deleteBucket empties bucket i and shifts back the buckets of the probe
// run after it that may move into the hole (those whose home is not
// within the hole's run ahead of them), so every probe still reaches its
// key before an empty bucket.
func (m *Map[K]) deleteBucket(i uint32) {
	mask := uint32(len(m.buckets) - 1)
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		e := m.buckets[j]
		if uint32(e) == 0 {
			break
		}
		home := uint32(e>>32) & mask
		// e may move to i when i lies on its probe from home to j,
		// cyclically: the distance from home to i is at most that to j.
		if (i-home)&mask <= (j-home)&mask {
			m.buckets[i] = e
			i = j
		}
	}
	m.buckets[i] = 0
}

// Len returns the number of keys mapped.
func (m *Map[K]) Len() int { return m.n }

// Index maps keys to items through their slots: a Map of the keys to slots
// of a Table of the items, each item knowing its key. A map of a million
// pointers is a million pointers the garbage collector visits at every
// cycle in hash order, each a cache miss on the object it names; here the
// items are found once, in slot order, through the Table
// (docs/benchmarks.md, "Garbage"). Like Table, Index does no locking. The
// zero value is empty and ready.
type Index[K Key, T Keyed[K]] struct {
	byKey  Map[K]
	bySlot Table[T]
}

// keyAt is the Map's keyAt: the key of the item in slot s, which the map
// holds (so the slot is taken).
func (x *Index[K, T]) keyAt(s uint32) K {
	v, _ := x.bySlot.Get(s)
	return v.SlotKey()
}

// Reserve makes room for n items without growing the hash table or
// reallocating the item table (a size hint).
func (x *Index[K, T]) Reserve(n int) {
	x.byKey.Reserve(n)
	x.bySlot.Reserve(n)
}

// Add maps v's key to v and returns v's slot. v must not be T's zero
// value, and its key should not be mapped (Lookup first): if it is, the
// key maps to v from now on, as a map's assignment would, and the item it
// mapped to keeps its slot until its owner frees it.
func (x *Index[K, T]) Add(v T) uint32 {
	s := x.bySlot.Take(v)
	x.byKey.Set(v.SlotKey(), s, x.keyAt)
	return s
}

// Lookup returns the item k maps to.
func (x *Index[K, T]) Lookup(k K) (T, bool) {
	s, ok := x.byKey.Get(k, x.keyAt)
	if !ok {
		var zero T
		return zero, false
	}
	return x.bySlot.Get(s)
}

// At returns the item in slot s (a hint from a peer: the caller checks
// that it is the item the peer named), and false for a free or unknown
// slot.
func (x *Index[K, T]) At(s uint32) (T, bool) { return x.bySlot.Get(s) }

// Remove unmaps v's key and frees its slot if the key maps to v, and
// reports whether it did (a newer item of the same key is left alone).
func (x *Index[K, T]) Remove(v T) bool {
	k := v.SlotKey()
	s, ok := x.byKey.Get(k, x.keyAt)
	if !ok {
		return false
	}
	if got, _ := x.bySlot.Get(s); got != v {
		return false
	}
	x.byKey.Delete(k, x.keyAt)
	x.bySlot.Free(s, v)
	return true
}

// Len returns the number of keys mapped.
func (x *Index[K, T]) Len() int { return x.byKey.Len() }

// All yields the items in slot order (the order the table holds them,
// so a walk over many reads memory in sequence, not in hash order).
func (x *Index[K, T]) All() iter.Seq[T] { return x.bySlot.All() }

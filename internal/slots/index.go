package slots

import "iter"

// Index maps keys to items through their slots: the map holds each key's
// slot, a plain integer, and the Table holds the item. A map of a million
// pointers is a million pointers the garbage collector visits at every
// cycle in the map's hash order, each a cache miss on the object it names
// (four such maps of a million made a full collection of the objects
// behind them nine times slower: 330 ms against 37); with keys and values
// free of pointers the map is memory the collector does not scan, and the
// items are found once, in slot order, through the Table.
//
// The key type should hold no pointers (an ID of integers), or the map is
// scanned all the same. Like Table, Index does no locking (its owner's
// lock guards it). The zero value is empty and ready.
type Index[K comparable, T comparable] struct {
	byKey  map[K]uint32
	bySlot Table[T]
}

// Reserve makes room for n items without rehashing the map or
// reallocating the table (a size hint).
func (x *Index[K, T]) Reserve(n int) {
	if x.byKey == nil {
		x.byKey = make(map[K]uint32, n)
	}
	x.bySlot.Reserve(n)
}

// Add maps k to v and returns v's slot. k must not be mapped (Lookup
// first), and v must not be T's zero value.
func (x *Index[K, T]) Add(k K, v T) uint32 {
	if x.byKey == nil {
		x.byKey = make(map[K]uint32)
	}
	s := x.bySlot.Take(v)
	x.byKey[k] = s
	return s
}

// Lookup returns the item k maps to.
func (x *Index[K, T]) Lookup(k K) (T, bool) {
	s, ok := x.byKey[k]
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

// Remove unmaps k and frees its slot if k maps to v, and reports whether
// it did (a newer item of the same key is left alone).
func (x *Index[K, T]) Remove(k K, v T) bool {
	s, ok := x.byKey[k]
	if !ok {
		return false
	}
	if got, _ := x.bySlot.Get(s); got != v {
		return false
	}
	delete(x.byKey, k)
	x.bySlot.Free(s, v)
	return true
}

// Len returns the number of keys mapped.
func (x *Index[K, T]) Len() int { return len(x.byKey) }

// All yields the items in slot order (the order the table holds them,
// so a walk over many reads memory in sequence, not in hash order).
func (x *Index[K, T]) All() iter.Seq[T] { return x.bySlot.All() }

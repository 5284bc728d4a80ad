// Package slots gives items small dense indexes: the slot a dispatcher's
// registration carries so that the other side of the wire finds it by
// index instead of by a map probe on its 16-byte ID (the collector's slots,
// echoed in resolved-ts; the service's, echoed in heartbeats).
//
// Invariants: slot 0 is never given (zero means none); a freed slot is
// given again before the table grows, so the table is as long as the most
// items held at once, plus one; Free of a slot another item holds now is a
// no-op. A slot read from a peer is a hint: Get returns whatever holds it,
// and the caller checks that it is the item the peer named. The table does
// no locking (its owner's lock guards it) and holds no package state.
package slots

import "iter"

// Table maps slots to items. The zero value is empty and ready.
type Table[T comparable] struct {
	items []T // items[0] is never used
	free  []uint32
	held  int
}

// Len is the number of items holding a slot.
func (t *Table[T]) Len() int { return t.held }

// All yields every item holding a slot, with its slot, in slot order.
// The table must not change during the iteration.
func (t *Table[T]) All() iter.Seq2[uint32, T] {
	return func(yield func(uint32, T) bool) {
		var zero T
		for i := 1; i < len(t.items); i++ {
			if v := t.items[i]; v != zero && !yield(uint32(i), v) {
				return
			}
		}
	}
}

// Take gives v a slot.
func (t *Table[T]) Take(v T) uint32 {
	t.held++
	if n := len(t.free); n > 0 {
		s := t.free[n-1]
		t.free = t.free[:n-1]
		t.items[s] = v
		return s
	}
	if len(t.items) == 0 {
		var zero T
		t.items = append(t.items, zero)
	}
	t.items = append(t.items, v)
	return uint32(len(t.items) - 1)
}

// Free returns slot s for reuse if v holds it (a slot already given to
// another item is left alone).
func (t *Table[T]) Free(s uint32, v T) {
	if s == 0 || int64(s) >= int64(len(t.items)) || t.items[s] != v {
		return
	}
	var zero T
	t.items[s] = zero
	t.free = append(t.free, s)
	t.held--
}

// Get returns the item in slot s, and false for slot 0, a slot out of
// range or a free one.
func (t *Table[T]) Get(s uint32) (T, bool) {
	var zero T
	if s == 0 || int64(s) >= int64(len(t.items)) || t.items[s] == zero {
		return zero, false
	}
	return t.items[s], true
}

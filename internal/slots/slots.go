package slots

import "iter"

// Table maps slots to items. The zero value is empty and ready.
type Table[T comparable] struct {
	items []T // items[0] is never used
	free  []uint32
}

// Take gives v a slot. v must not be the zero value, which Get cannot
// tell from a free slot.
func (t *Table[T]) Take(v T) uint32 {
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

// Reserve makes room for n items in all without reallocating the table
// (a size hint: a table that grows one item at a time copies itself about
// log2(n) times on the way to n).
func (t *Table[T]) Reserve(n int) {
	if n+1 > cap(t.items) {
		items := make([]T, len(t.items), n+1)
		copy(items, t.items)
		t.items = items
	}
}

// Free returns slot s for reuse if v holds it (a slot already given to
// another item is left alone).
func (t *Table[T]) Free(s uint32, v T) {
	var zero T
	if v == zero || s == 0 || int64(s) >= int64(len(t.items)) || t.items[s] != v {
		return
	}
	t.items[s] = zero
	t.free = append(t.free, s)
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

// All yields the items held, in slot order.
func (t *Table[T]) All() iter.Seq[T] {
	return func(yield func(T) bool) {
		var zero T
		for _, v := range t.items {
			if v != zero && !yield(v) {
				return
			}
		}
	}
}

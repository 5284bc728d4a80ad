package slots

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type item struct{ name string }

// TestSlotsAreDenseNonZeroAndReused: slots start at 1, a freed slot is
// given again before the table grows, Free by an item that no longer
// holds the slot changes nothing, and Get answers false for slot 0, a
// slot out of range and a free one.
func TestSlotsAreDenseNonZeroAndReused(t *testing.T) {
	var tb Table[*item]
	a, b, c := &item{"a"}, &item{"b"}, &item{"c"}
	sa, sb := tb.Take(a), tb.Take(b)
	require.Equal(t, []uint32{1, 2}, []uint32{sa, sb})
	got, ok := tb.Get(sa)
	require.True(t, ok)
	require.Same(t, a, got)

	tb.Free(sa, a)
	_, ok = tb.Get(sa)
	require.False(t, ok, "a free slot holds nothing")
	sc := tb.Take(c)
	require.Equal(t, sa, sc, "the freed slot is reused")
	tb.Free(sa, a) // a no longer holds it
	got, ok = tb.Get(sc)
	require.True(t, ok)
	require.Same(t, c, got, "a stale Free leaves the new holder")

	for _, s := range []uint32{0, 3, 1 << 31} {
		_, ok := tb.Get(s)
		require.False(t, ok, "slot %d", s)
		tb.Free(s, a) // out of range or zero: no-op, no panic
	}
	require.Equal(t, uint32(3), tb.Take(a), "the table grows once no slot is free")

	// Free of the zero value on a free slot would list the slot twice
	// (two later Takes would share it): it is a no-op.
	tb.Free(sa, c)
	tb.Free(sa, nil)
	s1, s2 := tb.Take(a), tb.Take(b)
	require.NotEqual(t, s1, s2, "a slot is given once")
}

// TestReserveKeepsSlotsAndStopsReallocation: Reserve keeps what the table
// holds, and Takes up to the reserved count do not move the table (the
// point of the hint); a smaller Reserve does nothing.
func TestReserveKeepsSlotsAndStopsReallocation(t *testing.T) {
	var tb Table[*item]
	a := &item{"a"}
	sa := tb.Take(a)
	tb.Reserve(100)
	got, ok := tb.Get(sa)
	require.True(t, ok)
	require.Same(t, a, got, "Reserve keeps the items")
	base := &tb.items[0]
	for i := range 99 {
		require.Equal(t, uint32(i+2), tb.Take(&item{"x"}))
	}
	require.Same(t, base, &tb.items[0], "100 items fit without reallocating")
	tb.Reserve(10)
	require.Same(t, base, &tb.items[0], "a smaller Reserve changes nothing")
	require.Equal(t, 101, len(tb.items))
}

// TestIndexKeepsKeysSlotsAndItemsInStep: a key finds its item through its
// slot, the slot finds the item, Remove by an item the key no longer maps
// to changes nothing, a removed key's slot is reused by the next item and
// its key no longer finds anything, and All yields every item held, in
// slot order, once.
func TestIndexKeepsKeysSlotsAndItemsInStep(t *testing.T) {
	var x Index[uint64, *item]
	a, b, c := &item{"a"}, &item{"b"}, &item{"c"}
	_, ok := x.Lookup(1)
	require.False(t, ok, "an empty index maps nothing")
	sa, sb := x.Add(1, a), x.Add(2, b)
	require.Equal(t, []uint32{1, 2}, []uint32{sa, sb})
	got, ok := x.Lookup(1)
	require.True(t, ok)
	require.Same(t, a, got)
	got, ok = x.At(sb)
	require.True(t, ok)
	require.Same(t, b, got)
	require.Equal(t, 2, x.Len())

	require.False(t, x.Remove(1, b), "1 maps to a, not b")
	require.False(t, x.Remove(3, a), "3 is not mapped")
	require.Equal(t, 2, x.Len())
	require.True(t, x.Remove(1, a))
	_, ok = x.Lookup(1)
	require.False(t, ok, "a removed key finds nothing")
	_, ok = x.At(sa)
	require.False(t, ok, "a removed item's slot is free")

	sc := x.Add(3, c)
	require.Equal(t, sa, sc, "the freed slot is reused")
	_, ok = x.Lookup(1)
	require.False(t, ok, "the slot's new item is not found by the old key")
	got, _ = x.Lookup(3)
	require.Same(t, c, got)

	var all []*item
	for v := range x.All() {
		all = append(all, v)
	}
	require.Equal(t, []*item{c, b}, all, "slot order: c took slot 1")
	for range x.All() {
		break // an early stop is honoured
	}
}

// TestIndexMapHoldsNoPointers: the map of an Index of pointer-free keys
// holds no pointers, which is what keeps it out of the collector's scan.
func TestIndexMapHoldsNoPointers(t *testing.T) {
	type id struct{ Hi, Lo uint64 }
	var x Index[id, *item]
	x.Reserve(4)
	require.False(t, hasPointers(reflect.TypeOf(x.byKey).Key()))
	require.False(t, hasPointers(reflect.TypeOf(x.byKey).Elem()))
}

func hasPointers(t reflect.Type) bool {
	switch t.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.String, reflect.Interface, reflect.Chan, reflect.Func, reflect.UnsafePointer:
		return true
	case reflect.Array:
		return t.Len() > 0 && hasPointers(t.Elem())
	case reflect.Struct:
		for i := range t.NumField() {
			if hasPointers(t.Field(i).Type) {
				return true
			}
		}
	}
	return false
}

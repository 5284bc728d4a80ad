package slots

import (
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

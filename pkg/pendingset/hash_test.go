package pendingset

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"
)

// Only types whose equality is equality of their bytes take the fast path.
func TestHasherFastPathOnlyForPlainKeys(t *testing.T) {
	type id struct{ Hi, Lo uint64 }
	type padded struct {
		A uint8
		B uint64
	}
	type wide struct{ A, B, C uint64 }
	for _, c := range []struct {
		typ  reflect.Type
		size uintptr
	}{
		{reflect.TypeFor[int](), 8}, {reflect.TypeFor[uint32](), 4}, {reflect.TypeFor[id](), 16},
		{reflect.TypeFor[[2]uint64](), 16}, {reflect.TypeFor[padded](), 0}, {reflect.TypeFor[wide](), 0},
		{reflect.TypeFor[float64](), 0}, {reflect.TypeFor[string](), 0}, {reflect.TypeFor[*int](), 0},
		{reflect.TypeFor[uint16](), 0},
	} {
		got := uintptr(0)
		if plainBytes(c.typ) {
			switch c.typ.Size() {
			case 4, 8, 16:
				got = c.typ.Size()
			}
		}
		require.Equal(t, c.size, got, "%v", c.typ)
	}
	require.Equal(t, uintptr(16), newHasher[id]().size)
	require.Zero(t, newHasher[string]().size)
}

// The fast path spreads the keys the service and the benchmarks use
// (sequential integers, IDs that differ in one word) over an index as
// evenly as a random hash would: the longest run of occupied positions at
// the index's load stays short.
func TestHasherSpreadsSequentialKeys(t *testing.T) {
	type id struct{ Hi, Lo uint64 }
	const keys, size = 100_000, 1 << 17 // the index at 100k keys: 0.76 full
	check := func(name string, tag func(i int) uint32) {
		occupied := make([]bool, size)
		for i := range keys {
			p := tag(i) & (size - 1)
			for occupied[p] {
				p = (p + 1) & (size - 1)
			}
			occupied[p] = true
		}
		longest, run := 0, 0
		for i := range 2 * size { // twice round: a run may wrap
			if occupied[i%size] {
				run++
				longest = max(longest, run)
			} else {
				run = 0
			}
		}
		// A random hash at this load gives runs of a few hundred at most;
		// a weak mix of sequential keys gives runs of thousands.
		require.Less(t, longest, 600, "%s: longest cluster", name)
	}
	hi := newHasher[id]()
	check("id{0,i}", func(i int) uint32 { k := id{Lo: uint64(i)}; return uint32(hi.hash(&k)) })
	check("id{i,0}", func(i int) uint32 { k := id{Hi: uint64(i)}; return uint32(hi.hash(&k)) })
	hn := newHasher[int]()
	check("int", func(i int) uint32 { k := i << 20; return uint32(hn.hash(&k)) })
	h32 := newHasher[uint32]()
	check("uint32", func(i int) uint32 { k := uint32(i); return uint32(h32.hash(&k)) })
}

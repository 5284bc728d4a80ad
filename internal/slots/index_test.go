package slots

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
)

// U64 is a uint64 as an Index's Key, for the tests.
type U64 uint64

func (k U64) SeededHash(seed uint64) uint64 { return (uint64(k) ^ seed) * 0x9e3779b97f4a7c15 }

type keyed struct {
	key  U64
	name string
}

func (k *keyed) SlotKey() U64 { return k.key }

// TestIndexKeepsKeysSlotsAndItemsInStep: a key finds its item through its
// slot, the slot finds the item, Remove of an item the key no longer maps
// to changes nothing, a removed key's slot is reused by the next item and
// its key no longer finds anything, and All yields every item held, in
// slot order, once.
func TestIndexKeepsKeysSlotsAndItemsInStep(t *testing.T) {
	var x Index[U64, *keyed]
	a, b, c := &keyed{1, "a"}, &keyed{2, "b"}, &keyed{3, "c"}
	_, ok := x.Lookup(1)
	require.False(t, ok, "an empty index maps nothing")
	require.False(t, x.Remove(a), "an empty index removes nothing")
	sa, sb := x.Add(a), x.Add(b)
	require.Equal(t, []uint32{1, 2}, []uint32{sa, sb})
	got, ok := x.Lookup(1)
	require.True(t, ok)
	require.Same(t, a, got)
	got, ok = x.At(sb)
	require.True(t, ok)
	require.Same(t, b, got)
	require.Equal(t, 2, x.Len())

	require.False(t, x.Remove(&keyed{1, "a2"}), "1 maps to a, not a2")
	require.False(t, x.Remove(c), "3 is not mapped")
	require.Equal(t, 2, x.Len())
	require.True(t, x.Remove(a))
	_, ok = x.Lookup(1)
	require.False(t, ok, "a removed key finds nothing")
	_, ok = x.At(sa)
	require.False(t, ok, "a removed item's slot is free")

	sc := x.Add(c)
	require.Equal(t, sa, sc, "the freed slot is reused")
	_, ok = x.Lookup(1)
	require.False(t, ok, "the slot's new item is not found by the old key")
	got, _ = x.Lookup(3)
	require.Same(t, c, got)

	var all []*keyed
	for v := range x.All() {
		all = append(all, v)
	}
	require.Equal(t, []*keyed{c, b}, all, "slot order: c took slot 1")
	for range x.All() {
		break // an early stop is honoured
	}
}

// crowded is a key whose hash has only a few values, so that keys share
// buckets' homes and the table's probing, wrap-around and back-shifting
// removal are what find them.
type crowded struct{ k uint64 }

func (c crowded) SeededHash(seed uint64) uint64 { return (c.k % 5) * 0x9e3779b9 }

type crowdedItem struct{ key crowded }

func (c *crowdedItem) SlotKey() crowded { return c.key }

// TestIndexAgreesWithAMapUnderChurn drives an Index and a Go map through
// the same random adds, removes and lookups, with keys from a small space
// whose hashes crowd into five homes, across growth from empty: after
// every step both agree on every key, and every item's slot finds it. A
// removal that left a hole in a probe run (no back-shift), or a
// back-shift that moved a bucket before its home, loses keys here.
func TestIndexAgreesWithAMapUnderChurn(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		r := rand.New(rand.NewPCG(seed, 0))
		var x Index[crowded, *crowdedItem]
		model := map[uint64]*crowdedItem{}
		for step := range 4000 {
			k := uint64(r.IntN(64))
			switch v, held := model[k]; {
			case held && r.IntN(2) == 0:
				require.True(t, x.Remove(v), "seed %d step %d: remove %d", seed, step, k)
				delete(model, k)
			case !held:
				v := &crowdedItem{crowded{k}}
				x.Add(v)
				model[k] = v
			}
			require.Equal(t, len(model), x.Len())
			for k := range uint64(64) {
				got, ok := x.Lookup(crowded{k})
				want, held := model[k]
				require.Equal(t, held, ok, "seed %d step %d: key %d", seed, step, k)
				if held {
					require.Same(t, want, got, "seed %d step %d: key %d", seed, step, k)
				}
			}
		}
	}
}

// TestIndexReserveHoldsWithoutGrowing: a reserved index takes that many
// keys without a new bucket array (the point of the hint), within the
// load that keeps probes short, and a smaller Reserve changes nothing.
func TestIndexReserveHoldsWithoutGrowing(t *testing.T) {
	var x Index[U64, *keyed]
	x.Reserve(1000)
	base := &x.byKey.buckets[0]
	for i := range 1000 {
		x.Add(&keyed{key: U64(i + 1)})
	}
	require.Same(t, base, &x.byKey.buckets[0], "1000 keys fit in the reserved buckets")
	require.LessOrEqual(t, x.Len()*maxLoadDen, len(x.byKey.buckets)*maxLoadNum)
	x.Reserve(10)
	require.Same(t, base, &x.byKey.buckets[0], "a smaller Reserve changes nothing")
	for i := range 1000 {
		got, ok := x.Lookup(U64(i + 1))
		require.True(t, ok)
		require.Equal(t, U64(i+1), got.key)
	}
}

// TestIndexAddOfAMappedKeyRemaps: Add of a key already mapped maps it to
// the new item, as a map's assignment would, and counts it once.
func TestIndexAddOfAMappedKeyRemaps(t *testing.T) {
	var x Index[U64, *keyed]
	a, a2 := &keyed{7, "a"}, &keyed{7, "a2"}
	x.Add(a)
	x.Add(a2)
	require.Equal(t, 1, x.Len())
	got, _ := x.Lookup(7)
	require.Same(t, a2, got)
	require.False(t, x.Remove(a), "7 maps to a2 now")
	require.True(t, x.Remove(a2))
	require.Zero(t, x.Len())
}

type idItem struct{ id common.DispatcherID }

func (d *idItem) SlotKey() common.DispatcherID { return d.id }

// BenchmarkIndex: Lookup of a held key and the index's own bytes per key
// (buckets only; the Table's slot array is the same for any index) at a
// million random IDs, the population of the 1M cdcserver run.
func BenchmarkIndex(b *testing.B) {
	const n = 1 << 20
	r := rand.New(rand.NewPCG(1, 2))
	items := make([]*idItem, n)
	var x Index[common.DispatcherID, *idItem]
	x.Reserve(n)
	for i := range items {
		items[i] = &idItem{common.NewDispatcherID(r)}
		x.Add(items[i])
	}
	b.ResetTimer()
	for i := range b.N {
		d := items[uint32(i*0x9e3779b1)%n]
		if got, ok := x.Lookup(d.id); !ok || got != d {
			b.Fatal("lost")
		}
	}
	b.ReportMetric(float64(len(x.byKey.buckets)*8)/n, "B/key")
}

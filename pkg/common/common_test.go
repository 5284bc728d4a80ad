package common

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestTsComposeAndRead(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_123)
	ts := ComposeTs(now.UnixMilli(), 7)
	require.Equal(t, now.UnixMilli(), ts.PhysicalMs())
	require.Equal(t, int64(7), ts.Logical())
	require.True(t, ts.Physical().Equal(now))
	require.Equal(t, TsFromTime(now)+7, ts)
	// Logical overflow is masked, never bleeds into the physical part.
	require.Equal(t, now.UnixMilli(), ComposeTs(now.UnixMilli(), MaxLogical+1).PhysicalMs())
	require.Equal(t, 2*time.Second, ts.Lag(now.Add(2*time.Second)))
	require.Zero(t, ts.Lag(now.Add(-time.Second)))
	// Order of Ts follows physical then logical order.
	require.Less(t, ComposeTs(1, MaxLogical), ComposeTs(2, 0))
}

func TestSpanValidate(t *testing.T) {
	require.NoError(t, TableSpan(3).Validate())
	require.NoError(t, Span{TableID: 1, StartKey: []byte("a"), EndKey: []byte("b")}.Validate())
	err := Span{TableID: -1, StartKey: []byte("b"), EndKey: []byte("a")}.Validate()
	require.True(t, errors.Is(err, ErrInvalidSpan))
	require.Contains(t, err.Error(), "negative table id")
	require.Contains(t, err.Error(), "not after start key")
	require.ErrorIs(t, Span{TableID: 1, StartKey: []byte("a"), EndKey: []byte("a")}.Validate(), ErrInvalidSpan)
	long := make([]byte, MaxSpanKeyBytes+1)
	require.ErrorIs(t, Span{TableID: 1, StartKey: long}.Validate(), ErrInvalidSpan, "a start key over the bound")
	require.ErrorIs(t, Span{TableID: 1, EndKey: long}.Validate(), ErrInvalidSpan, "an end key over the bound")
	require.NoError(t, Span{TableID: 1, EndKey: long[:MaxSpanKeyBytes]}.Validate())
}

func TestSpanContainsOverlaps(t *testing.T) {
	ab := Span{TableID: 1, StartKey: []byte("a"), EndKey: []byte("c")}
	require.True(t, ab.Contains([]byte("a")))
	require.True(t, ab.Contains([]byte("bzz")))
	require.False(t, ab.Contains([]byte("c")))
	require.False(t, ab.Contains([]byte("")))
	all := TableSpan(1)
	require.True(t, all.Contains(nil))
	require.True(t, all.Contains([]byte{0xff, 0xff}))

	cd := Span{TableID: 1, StartKey: []byte("c"), EndKey: []byte("d")}
	require.False(t, ab.Overlaps(cd), "half-open spans that touch do not overlap")
	require.False(t, cd.Overlaps(ab))
	require.True(t, all.Overlaps(cd))
	require.True(t, cd.Overlaps(all))
	require.False(t, TableSpan(2).Overlaps(all))
	bz := Span{TableID: 1, StartKey: []byte("b")}
	require.True(t, bz.Overlaps(ab))
	require.True(t, ab.Overlaps(bz))

	require.True(t, ab.Equal(Span{TableID: 1, StartKey: []byte("a"), EndKey: []byte("c")}))
	require.Equal(t, ab.Key(), Span{TableID: 1, StartKey: []byte("a"), EndKey: []byte("c")}.Key())
	// The start length is part of the key, so a different split never collides.
	require.NotEqual(t, ab.Key(), Span{TableID: 1, StartKey: []byte("ac")}.Key())
}

func TestRowCloneIsDeep(t *testing.T) {
	r := Row{Op: OpPut, Key: []byte("k"), Value: []byte("v"), StartTs: 1, CommitTs: 2}
	c := r.Clone()
	r.Key[0] = 'x'
	require.Equal(t, []byte("k"), c.Key)
	require.Equal(t, 2, c.Size())
	require.True(t, OpDelete.Valid())
	require.False(t, OpType(9).Valid())
	require.Equal(t, "op(9)", OpType(9).String())
}

func TestDispatcherIDHashSpreads(t *testing.T) {
	const workers = 8
	var counts [workers]int
	for i := range uint64(8000) {
		counts[DispatcherIDFromUint64(i).Index(workers)]++
	}
	for w, c := range counts {
		// Sequential IDs must not pile up on a few workers.
		require.InDelta(t, 1000, c, 150, "worker %d", w)
	}
	id := NewDispatcherID(rand.New(rand.NewPCG(1, 2)))
	require.False(t, id.IsZero())
	require.True(t, DispatcherID{}.IsZero())
	require.Len(t, id.String(), 32)
	b := id.Bytes()
	require.Len(t, b, 16)
}

// TestSpanKeyEqualExactlyForEqualSpans: over many random spans with short
// keys drawn from a small alphabet (so that splits and prefixes collide
// often), two keys are equal exactly when the spans are.
func TestSpanKeyEqualExactlyForEqualSpans(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	key := func() []byte {
		b := make([]byte, rng.IntN(3))
		for i := range b {
			b[i] = "ab"[rng.IntN(2)]
		}
		return b
	}
	spans := make([]Span, 200)
	for i := range spans {
		spans[i] = Span{TableID: int64(rng.IntN(3)) - 1, StartKey: key(), EndKey: key()}
	}
	for _, a := range spans {
		for _, b := range spans {
			require.Equal(t, a.Equal(b), a.Key() == b.Key(), "%v vs %v", a, b)
		}
	}
}

// TestSeededHashResistsChosenIDs: the IDs a peer could pick to share a
// bucket without the seed (equal but for the top bit of each word, which
// an unseeded multiply-and-xor maps alike; or equal Hi) hash apart, and
// the same ID hashes differently under two seeds.
func TestSeededHashResistsChosenIDs(t *testing.T) {
	const seed = 0x1234_5678_9abc_def0
	a := DispatcherID{Hi: 5, Lo: 9}
	b := DispatcherID{Hi: 5 ^ 1<<63, Lo: 9 ^ 1<<63}
	require.Equal(t, a.Hash(), b.Hash(), "the unseeded hash maps this pair alike")
	require.NotEqual(t, uint32(a.SeededHash(seed)), uint32(b.SeededHash(seed)))
	c := DispatcherID{Hi: 5, Lo: 10}
	require.NotEqual(t, uint32(a.SeededHash(seed)), uint32(c.SeededHash(seed)))
	require.NotEqual(t, a.SeededHash(seed), a.SeededHash(seed+1))

	// Sequential IDs (the demo's) spread over a table's homes.
	const homes = 1 << 10
	used := map[uint64]bool{}
	for n := range uint64(homes) {
		used[DispatcherIDFromUint64(n+1).SeededHash(seed)%homes] = true
	}
	require.Greater(t, len(used), homes/2, "about 1-1/e of the homes are used by as many random keys")
}

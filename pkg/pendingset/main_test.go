package pendingset

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/cdcflow/eventservice/pkg/clock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// t0 is the fake clocks' epoch.
var t0 = time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)

// maxMerge keeps the larger value: the shape of "keep the newest
// resolved-ts".
func maxMerge(old, new uint64) uint64 { return max(old, new) }

// newTestSet returns a Set[int, uint64] with a fake clock, no jitter
// (Rand returns 0) and maxMerge; edit adjusts the options first.
func newTestSet(t testing.TB, edit func(*Options[int, uint64])) (*Set[int, uint64], *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(t0)
	o := Options[int, uint64]{
		Merge: maxMerge,
		Clock: clk,
		Rand:  func() float64 { return 0 },
	}
	if edit != nil {
		edit(&o)
	}
	s, err := New(o)
	require.NoError(t, err)
	return s, clk
}

// setResults marks the entries whose keys are listed with r.
func setResults(batch []Entry[int, uint64], r Result, keys ...int) {
	for j := range batch {
		for _, k := range keys {
			if batch[j].Key == k {
				batch[j].Result = r
			}
		}
	}
}

// keysOf returns the batch's keys in order.
func keysOf(batch []Entry[int, uint64]) []int {
	ks := make([]int, len(batch))
	for j := range batch {
		ks[j] = batch[j].Key
	}
	return ks
}

// valuesOf returns key -> value of the batch.
func valuesOf(batch []Entry[int, uint64]) map[int]uint64 {
	m := make(map[int]uint64, len(batch))
	for _, e := range batch {
		m[e.Key] = e.Value
	}
	return m
}

// checkInvariants verifies every structural invariant of s and fails t
// with the first violation.
func checkInvariants[K comparable, V any](t testing.TB, s *Set[K, V]) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var count [numStates]int
	// The index: every entry maps its key's tag to a node whose slot holds
	// that key, is reachable from its home without crossing an empty
	// entry, and the key is found there; every node has exactly one entry.
	require.Zero(t, len(s.mu.index)&(len(s.mu.index)-1), "index size %d not a power of two", len(s.mu.index))
	require.Equal(t, len(s.mu.nodes), len(s.mu.slots), "a slot per node")
	used := 0
	mapped := make([]bool, len(s.mu.nodes))
	for p, e := range s.mu.index {
		if e == 0 {
			continue
		}
		used++
		i := entryNode(e)
		require.Less(t, int(i), len(s.mu.nodes), "entry %d refers past the nodes", p)
		require.False(t, mapped[i], "node %d has two entries", i)
		mapped[i] = true
		k := s.mu.slots[i].key
		require.Equal(t, s.tagLocked(k), entryTag(e), "entry %d: tag is not its key's", p)
		mask := uint32(len(s.mu.index) - 1)
		for q := entryTag(e) & mask; q != uint32(p); q = (q + 1) & mask {
			require.NotZero(t, s.mu.index[q], "entry %d unreachable: empty position %d on its probe path", p, q)
		}
		fi, ok := s.findLocked(k)
		require.True(t, ok && fi == i, "key of node %d not found", i)
	}
	require.Equal(t, s.mu.used, used, "used entry count")
	require.Equal(t, len(s.mu.nodes), used, "an entry per node")
	require.LessOrEqual(t, used*maxLoadDen, len(s.mu.index)*maxLoadNum, "index over its maximum load")
	for i := range s.mu.nodes {
		n := &s.mu.nodes[i]
		h := s.slotLocked(int32(i))
		count[h.state]++
		inHeap := h.state == stateBackoff || h.state == stateQuarantined
		require.Equal(t, inHeap, n.heapIdx != none, "node %d %v heapIdx %d", i, h.state, n.heapIdx)
		require.True(t, !h.dirty || h.state == stateInFlight, "dirty outside in-flight")
		if h.state == stateIdle {
			require.Zero(t, n.attempts, "idle node keeps attempts")
		}
	}
	require.Equal(t, s.mu.count, count, "state counts")
	require.LessOrEqual(t, len(s.mu.nodes), max(s.mu.maxLen, 0), "nodes beyond the peak held")

	inFIFO := make([]bool, len(s.mu.nodes))
	for j := range s.mu.ready.len {
		i := s.mu.ready.at(j)
		require.Equal(t, stateReady, s.slotLocked(i).state, "non-ready node in FIFO")
		require.False(t, inFIFO[i], "node %d twice in the FIFO", i)
		inFIFO[i] = true
	}
	require.Equal(t, count[stateReady], s.mu.ready.len, "FIFO length")
	require.LessOrEqual(t, len(s.mu.ready.buf), max(8, 2*len(s.mu.nodes)), "FIFO ring beyond twice the nodes")

	// Every idle node has exactly one live idle queue entry, and the queue
	// stays within its compaction bound.
	live := make(map[int32]int)
	for _, e := range s.mu.idle[s.mu.idleHead:] {
		if s.idleLiveLocked(e) {
			live[e.idx]++
		}
	}
	require.Len(t, live, count[stateIdle], "idle nodes without a live queue entry")
	for i, c := range live {
		require.Equal(t, 1, c, "node %d has %d live idle entries", i, c)
	}
	require.LessOrEqual(t, len(s.mu.idle)-s.mu.idleHead, len(s.mu.nodes)+len(s.mu.nodes)/2+64, "idle queue beyond its bound")

	require.Equal(t, count[stateBackoff]+count[stateQuarantined], len(s.mu.heap), "heap size")
	for j, i := range s.mu.heap {
		require.Equal(t, int32(j), s.mu.nodes[i].heapIdx, "heapIdx")
		if j > 0 {
			require.False(t, s.heapLessLocked(i, s.mu.heap[(j-1)/2]), "heap order at %d", j)
		}
	}
}

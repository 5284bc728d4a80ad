package pendingset

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// Outcome: N adds to one key between drains give one delivery, carrying the
// merged value.
func TestCoalesceNAddsOneDelivery(t *testing.T) {
	s, _ := newTestSet(t, nil)
	const n = 1000
	for i := range uint64(n) {
		// Values arrive out of order; Merge keeps the max.
		s.Add(7, (i*7919)%n)
	}
	batch := s.Drain(0, nil)
	require.Len(t, batch, 1)
	require.Equal(t, 7, batch[0].Key)
	require.Equal(t, uint64(n-1), batch[0].Value)
	require.Empty(t, s.Drain(0, nil), "one delivery, not one per add")
	require.NoError(t, s.Complete(batch, nil))
	st := s.Stats()
	require.Equal(t, uint64(n), st.Adds)
	require.Equal(t, uint64(n-1), st.Coalesced)
	require.Equal(t, uint64(1), st.Delivered)
	require.Zero(t, st.Len)
	checkInvariants(t, s)
}

// Adds while a key is in flight cause exactly one more delivery, after the
// first completes, with the merged value of those adds.
func TestAddWhileInFlightDeliversOnceMore(t *testing.T) {
	s, _ := newTestSet(t, nil)
	s.Add(1, 10)
	first := s.Drain(0, nil)
	require.Len(t, first, 1)
	for v := uint64(11); v <= 20; v++ {
		s.Add(1, v)
	}
	require.Empty(t, s.Drain(0, nil), "never in two batches at once")
	require.Equal(t, 1, s.InFlight())
	require.NoError(t, s.Complete(first, nil))

	second := s.Drain(0, nil)
	require.Equal(t, []int{1}, keysOf(second))
	require.Equal(t, uint64(20), second[0].Value)
	require.NoError(t, s.Complete(second, nil))
	require.Empty(t, s.Drain(0, nil), "one more time, not once per add")
	require.Zero(t, s.Len())
	// The first add during flight is a new obligation, the other 9 coalesce.
	require.Equal(t, uint64(9), s.Stats().Coalesced)
	checkInvariants(t, s)
}

// Batches are bounded and follow first-pending order; a hot key keeps its
// place instead of starving the others, and a key added again after its
// delivery goes to the back.
func TestDrainOrderIsFirstPendingOrder(t *testing.T) {
	s, _ := newTestSet(t, nil)
	for k := range 5 {
		s.Add(k, 1)
	}
	for v := range uint64(100) {
		s.Add(0, v) // hot key
	}
	b := s.Drain(2, nil)
	require.Equal(t, []int{0, 1}, keysOf(b))
	require.NoError(t, s.Complete(b, nil))
	s.Add(0, 500) // re-added after delivery: goes behind 2, 3, 4
	s.Add(9, 1)
	b = s.Drain(0, nil)
	require.Equal(t, []int{2, 3, 4, 0, 9}, keysOf(b))
	require.Equal(t, uint64(500), valuesOf(b)[0])
	require.NoError(t, s.Complete(b, nil))
	checkInvariants(t, s)
}

// Add allocates nothing when the key is already held, in every state.
func TestAddZeroAllocsWhenHeld(t *testing.T) {
	s, _ := newTestSet(t, nil)
	s.Add(1, 1) // ready
	s.Add(2, 1)
	s.Add(3, 1)
	b := s.Drain(2, nil) // 1 and 2 in flight
	setResults(b, FailedKey, 2)
	s.Add(1, 2) // 1 dirty
	require.NoError(t, s.Complete(b, nil))
	// 1 ready again (dirty after delivery), 2 backing off, 3 ready.
	s.Add(4, 1)
	b4 := s.Drain(0, nil)
	require.Len(t, b4, 3) // 3, 4, 1; now in flight
	var v uint64
	for _, k := range []int{2, 3} { // backoff; in flight (then dirty)
		allocs := testing.AllocsPerRun(1000, func() { v++; s.Add(k, v) })
		require.Zero(t, allocs, "key %d", k)
	}
	require.NoError(t, s.Complete(b4, nil))
	allocs := testing.AllocsPerRun(1000, func() { v++; s.Add(3, v) }) // ready
	require.Zero(t, allocs)
	checkInvariants(t, s)
}

// AddMany is the same adds one by one: the same batches, values, stats and
// states (a ready key merged, an in-flight one kept dirty, a new one
// queued), one doorbell token, and it refuses slices of different lengths.
func TestAddManyIsAddsInOrder(t *testing.T) {
	one, many := func() (*Set[int, uint64], *Set[int, uint64]) {
		a, _ := newTestSet(t, nil)
		b, _ := newTestSet(t, nil)
		return a, b
	}()
	for _, s := range []*Set[int, uint64]{one, many} {
		s.Add(1, 1)
		s.Add(2, 1)
		<-s.Doorbell()
	}
	f1, f2 := one.Drain(1, nil), many.Drain(1, nil) // key 1 in flight
	keys, vals := []int{1, 2, 3, 1, 3}, []uint64{5, 7, 2, 4, 9}
	for i := range keys {
		one.Add(keys[i], vals[i])
	}
	many.AddMany(keys, vals)
	require.NoError(t, one.Complete(f1, nil))
	require.NoError(t, many.Complete(f2, nil))
	b1, b2 := one.Drain(0, nil), many.Drain(0, nil)
	require.Equal(t, keysOf(b1), keysOf(b2))
	require.Equal(t, valuesOf(b1), valuesOf(b2))
	require.Equal(t, []int{2, 3, 1}, keysOf(b2))
	require.Equal(t, map[int]uint64{1: 5, 2: 7, 3: 9}, valuesOf(b2))
	require.Equal(t, one.Stats().Adds, many.Stats().Adds)
	require.Equal(t, one.Stats().Coalesced, many.Stats().Coalesced)

	// One token for a whole batch into an empty FIFO.
	require.NoError(t, many.Complete(b2, nil))
	select {
	case <-many.Doorbell(): // Complete's requeue token, if any
	default:
	}
	many.AddMany([]int{7, 8, 9}, []uint64{1, 1, 1})
	<-many.Doorbell()
	select {
	case <-many.Doorbell():
		t.Fatal("doorbell holds more than one token")
	default:
	}
	require.Panics(t, func() { many.AddMany([]int{1}, nil) })
	checkInvariants(t, one)
	checkInvariants(t, many)
}

// The doorbell holds at most one token; Add rings it only when a key
// becomes ready in an empty FIFO (a consumer that took a token drains
// until empty, so keys joining a non-empty FIFO are found without one),
// and the consumer drains until empty.
func TestDoorbell(t *testing.T) {
	s, _ := newTestSet(t, nil)
	select {
	case <-s.Doorbell():
		t.Fatal("doorbell rang on an empty set")
	default:
	}
	for k := range 100 {
		s.Add(k, 1)
	}
	<-s.Doorbell()
	select {
	case <-s.Doorbell():
		t.Fatal("doorbell holds more than one token")
	default:
	}
	s.Add(200, 1) // joins a non-empty FIFO whose consumer holds a token
	select {
	case <-s.Doorbell():
		t.Fatal("doorbell rang for a key joining a non-empty FIFO")
	default:
	}
	b := s.Drain(0, nil)
	require.Len(t, b, 101, "draining until empty finds it all the same")
	s.Add(5, 2) // in flight: no ring, Complete rings when it requeues
	select {
	case <-s.Doorbell():
		t.Fatal("doorbell rang for an in-flight key")
	default:
	}
	require.NoError(t, s.Complete(b, nil))
	<-s.Doorbell()
	require.Equal(t, []int{5}, keysOf(s.Drain(0, nil)))
}

// Outcome: with no consumer at all (the pump stalled), Add returns and
// keeps returning for 1M adds, and the set holds one entry per key.
func TestAddNeverBlocksWithoutConsumer(t *testing.T) {
	s, _ := newTestSet(t, nil)
	const adds, keys = 1_000_000, 4096
	for i := range adds {
		s.Add(i%keys, uint64(i))
	}
	st := s.Stats()
	require.Equal(t, uint64(adds), st.Adds)
	require.Equal(t, uint64(adds-keys), st.Coalesced)
	require.Equal(t, keys, st.Len)
	require.Equal(t, keys, st.MaxLen)
	checkInvariants(t, s)
}

// Outcome: memory bound. 10M adds over 1k keys, with a consumer draining,
// failing and retrying along the way, never hold more than 1k entries.
func TestMemoryBoundedByDistinctKeys(t *testing.T) {
	const keys = 1000
	adds := 10_000_000
	if testing.Short() {
		adds = 1_000_000
	}
	s, clk := newTestSet(t, func(o *Options[int, uint64]) { o.MaxBatch = 256 })
	var batch []Entry[int, uint64]
	for i := range adds {
		s.Add((i*7)%keys, uint64(i))
		if i%4093 == 0 { // a consumer in the same goroutine keeps this deterministic
			for j := range batch {
				switch (i + j) % 13 {
				case 0:
					batch[j].Result = FailedKey
				case 1:
					batch[j].Result = RetryKey
				}
			}
			require.NoError(t, s.Complete(batch, nil))
			clk.Advance(DefaultBackoffBase)
			batch = s.Drain(0, batch[:0])
		}
	}
	require.NoError(t, s.Complete(batch, nil))
	st := s.Stats()
	require.LessOrEqual(t, st.MaxLen, keys)
	require.LessOrEqual(t, len(s.mu.nodes), keys, "node slice never outgrew the key count")
	require.LessOrEqual(t, s.mu.used, keys, "index never outgrew the key count")
	require.Equal(t, uint64(adds), st.Adds)
	require.Positive(t, st.KeyFailures)
	checkInvariants(t, s)
}

// A delivered key's slot stays mapped (idle) so that adding it again is a
// map hit with no allocation; a new key repurposes the longest-idle slot,
// so the footprint stays at the peak number of keys held at once.
func TestIdleSlotsAreReusedOldestFirst(t *testing.T) {
	s, _ := newTestSet(t, nil)
	for k := range 4 {
		s.Add(k, 1)
	}
	require.NoError(t, s.Complete(s.Drain(0, nil), nil))
	st := s.Stats()
	require.Equal(t, 0, st.Len)
	require.Equal(t, 4, st.Idle)
	require.Equal(t, 4, st.MaxLen)

	var v uint64 = 1
	buf := make([]Entry[int, uint64], 0, 1)
	var completeErr error // the first error, checked after the measured loop
	allocs := testing.AllocsPerRun(100, func() {
		v++
		s.Add(2, v) // revive
		buf = s.Drain(0, buf[:0])
		if err := s.Complete(buf, nil); err != nil && completeErr == nil {
			completeErr = err
		}
	})
	require.NoError(t, completeErr)
	require.Zero(t, allocs, "a full add-drain-complete cycle of a known key")
	require.Equal(t, 4, s.Stats().Idle)

	// Idle order is now 0, 1, 3, 2. Three new keys take 0, 1 and 3's slots.
	for k := 10; k < 13; k++ {
		s.Add(k, 1)
	}
	require.Len(t, s.mu.nodes, 4, "no growth while idle slots exist")
	_, has0 := s.findLocked(0)
	_, has2 := s.findLocked(2)
	require.False(t, has0, "oldest idle key forgotten")
	require.True(t, has2, "most recently delivered key still mapped")
	s.Add(0, 5) // forgotten keys come back as new keys: 2's slot, then growth
	s.Add(1, 5)
	require.Len(t, s.mu.nodes, 5)
	require.Equal(t, 5, s.Len())
	b := s.Drain(0, nil)
	require.Equal(t, []int{10, 11, 12, 0, 1}, keysOf(b))
	require.Equal(t, uint64(5), valuesOf(b)[0])
	require.NoError(t, s.Complete(b, nil))
	checkInvariants(t, s)
}

// TestAPanickingMergeLeavesTheSetUsable: Merge is the user's code and runs
// under the set's lock; the lock is released by defer, so a Merge that
// panics (in Add, or merging back in Complete) does not wedge every later
// call.
func TestAPanickingMergeLeavesTheSetUsable(t *testing.T) {
	boom := true
	s, _ := newTestSet(t, func(o *Options[int, uint64]) {
		o.Merge = func(old, fresh uint64) uint64 {
			if boom {
				panic("merge bug")
			}
			return max(old, fresh)
		}
	})
	s.Add(1, 1)
	require.Panics(t, func() { s.Add(1, 2) }, "a merge into a held key")
	require.True(t, s.mu.TryLock(), "Add released the lock")
	s.mu.Unlock()

	batch := s.Drain(0, nil)
	require.Len(t, batch, 1)
	s.Add(1, 3) // in flight: the first add is kept aside, no merge
	require.Panics(t, func() { _ = s.Complete(batch, errors.New("down")) }, "a merge back of the failed value")
	require.True(t, s.mu.TryLock(), "Complete released the lock")
	s.mu.Unlock()

	boom = false
	s.Add(2, 5)
	require.NotEmpty(t, s.Drain(0, nil), "the set still works")
}

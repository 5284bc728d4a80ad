package pendingset

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSupersedesKeepsTheNewestAcrossDelivery: a late, older value added
// while a newer one is in flight (or after it was delivered) is delivered
// after it without Supersedes, and dropped with it.
func TestSupersedesKeepsTheNewestAcrossDelivery(t *testing.T) {
	for _, on := range []bool{false, true} {
		s, _ := newTestSet(t, func(o *Options[int, uint64]) {
			if on {
				o.Supersedes = func(v, delivered uint64) bool { return v > delivered }
			}
		})
		s.Add(1, 5)
		b := s.Drain(0, nil) // 5 in flight
		s.Add(1, 3)          // an older write arrives late
		require.NoError(t, s.Complete(b, nil))
		next := s.Drain(0, nil)
		if !on {
			require.Len(t, next, 1)
			require.Equal(t, uint64(3), next[0].Value, "without Supersedes the older value goes out last")
			continue
		}
		require.Empty(t, next, "superseded by the delivered 5")
		s.Add(1, 4) // older than the delivered 5, key idle
		require.Empty(t, s.Drain(0, nil))
		s.Add(1, 6)
		next = s.Drain(0, nil)
		require.Len(t, next, 1)
		require.Equal(t, uint64(6), next[0].Value)
		require.NoError(t, s.Complete(next, nil))
		require.Equal(t, uint64(2), s.Stats().Superseded)
		require.Zero(t, s.Len())
	}
}

// TestSupersedesSharedWriters: four writers add versions 1..20 of 1,000
// keys the set knows, in random order, while a pump delivers; with Merge = max and
// Supersedes = newer, the last value delivered for every key is its
// newest version.
func TestSupersedesSharedWriters(t *testing.T) {
	const keys, versions, writers = 1000, 20, 4
	s, _ := newTestSet(t, func(o *Options[int, uint64]) {
		o.Supersedes = func(v, delivered uint64) bool { return v > delivered }
		o.MaxBatch = 64
	})
	var mu sync.Mutex
	last := make(map[int]uint64, keys)
	p, err := NewPump(s, func(_ context.Context, batch []Entry[int, uint64]) error {
		mu.Lock()
		defer mu.Unlock()
		for _, e := range batch {
			last[e.Key] = e.Value
		}
		return nil
	})
	require.NoError(t, err)
	// Every key is known (delivered once, version 0) before the writers
	// start: a never-seen key arriving later may take the idle slot of a
	// delivered one, which then forgets its last delivery (documented on
	// Options.Supersedes); this test is about keys that keep their slots.
	for k := range keys {
		s.Add(k, 0)
	}
	require.NoError(t, p.Start())
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			var adds [][2]int
			for k := range keys {
				for v := 1 + w; v <= versions; v += writers {
					adds = append(adds, [2]int{k, v})
				}
			}
			rng.Shuffle(len(adds), func(i, j int) { adds[i], adds[j] = adds[j], adds[i] })
			for _, a := range adds {
				s.Add(a[0], uint64(a[1]))
			}
		})
	}
	wg.Wait()
	require.NoError(t, p.Drain(context.Background()))
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, last, keys)
	for k, v := range last {
		require.Equal(t, uint64(versions), v, "key %d ended below its newest version", k)
	}
}

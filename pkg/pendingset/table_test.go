package pendingset

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/stretchr/testify/require"
)

// The index is a hand-written hash table: entries move when it grows and
// when a deletion (a new key taking the longest-idle key's node) shifts a
// cluster back. Churn through a key space ten times larger than the keys
// held at once, with a metrics-enabled set so values are also time-stamped
// (the stamp lives in the node, not the slot), and check after every step
// that each entry is reachable from its home, carries its key's tag and
// is the only one for its node (checkInvariants), and at the end that every key's newest value
// was delivered last.
func TestIndexSurvivesChurn(t *testing.T) {
	for seed := range uint64(4) {
		rng := rand.New(rand.NewPCG(seed, 99))
		s, clk := newTestSet(t, func(o *Options[int, uint64]) {
			o.MaxBatch = 64
			o.Registerer = prometheus.NewRegistry()
		})
		lastAdded := map[int]uint64{}
		lastDelivered := map[int]uint64{}
		var v uint64
		var inFlight []Entry[int, uint64]
		for step := range 6000 {
			switch r := rng.IntN(10); {
			case r < 6:
				// Mostly a small hot range, sometimes anywhere in a range ten
				// times the set's working size.
				k := rng.IntN(50)
				if rng.IntN(3) == 0 {
					k = rng.IntN(3000)
				}
				v++
				s.Add(k, v)
				lastAdded[k] = v
			case r < 8:
				start := len(inFlight)
				inFlight = s.Drain(rng.IntN(64)+1, inFlight)
				for _, e := range inFlight[start:] {
					require.True(t, e.since == noStamp || (e.since >= 0 && e.since <= e.drained),
						"key %d: first add at %d, drained at %d", e.Key, e.since, e.drained)
				}
			default:
				for j := range inFlight {
					lastDelivered[inFlight[j].Key] = max(lastDelivered[inFlight[j].Key], inFlight[j].Value)
				}
				require.NoError(t, s.Complete(inFlight, nil))
				inFlight = inFlight[:0]
			}
			clk.Advance(time.Millisecond)
			if step%50 == 0 {
				checkInvariants(t, s)
			}
		}
		require.NoError(t, s.Complete(inFlight, nil))
		for j := range inFlight {
			lastDelivered[inFlight[j].Key] = max(lastDelivered[inFlight[j].Key], inFlight[j].Value)
		}
		for {
			b := s.Drain(0, nil)
			if len(b) == 0 {
				break
			}
			for j := range b {
				lastDelivered[b[j].Key] = max(lastDelivered[b[j].Key], b[j].Value)
			}
			require.NoError(t, s.Complete(b, nil))
		}
		checkInvariants(t, s)
		require.Equal(t, lastAdded, lastDelivered, "seed %d: a key's newest value was not delivered", seed)
		require.Less(t, len(s.mu.nodes), 3000, "seed %d: idle nodes were not repurposed", seed)
	}
}

// Keys that cycle between idle and ready without a new key ever arriving
// leave a stale idle-queue entry per cycle; the queue must be compacted
// rather than grow with the number of deliveries.
func TestIdleQueueStaysBounded(t *testing.T) {
	s, _ := newTestSet(t, nil)
	var v uint64
	for range 10_000 {
		for k := range 8 {
			v++
			s.Add(k, v)
		}
		require.NoError(t, s.Complete(s.Drain(0, nil), nil))
	}
	checkInvariants(t, s)
	require.LessOrEqual(t, len(s.mu.idle), 8+8/2+64, "idle queue grew with deliveries")
	require.Equal(t, 8, s.Stats().Idle)
}

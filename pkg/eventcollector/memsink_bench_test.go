package eventcollector

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cdcflow/eventservice/pkg/common"
)

// BenchmarkMemorySinkCheckpointBatch applies resolved-ts batches of 512
// checkpoints, the dispatchers of each batch drawn in random order (as a
// staggered cadence hands them over), to a MemorySink of n dispatchers:
// found by their slot in the collector (by=slot, what the collector
// passes) and by ID alone (by=id: every entry's slot is beyond the cache,
// so each probes the map on its 16-byte ID, as before slots were passed).
// ns/checkpoint is the cost of one entry.
func BenchmarkMemorySinkCheckpointBatch(b *testing.B) {
	for _, n := range []int{10_000, 1_000_000} {
		for _, by := range []string{"slot", "id"} {
			b.Run(fmt.Sprintf("dispatchers=%d/by=%s", n, by), func(b *testing.B) { benchMemorySinkCheckpointBatch(b, n, by == "slot") })
		}
	}
}

func benchMemorySinkCheckpointBatch(b *testing.B, n int, bySlot bool) {
	const batch = 512
	s := NewMemorySink()
	cps := make([]SinkCheckpoint, n)
	for i := range cps {
		cps[i] = SinkCheckpoint{ID: common.DispatcherIDFromUint64(uint64(i + 1)), Slot: uint32(i)}
		if !bySlot {
			cps[i].Slot = maxSlotCache + uint32(i)
		}
	}
	errs := make([]error, batch)
	for i := 0; i < n; i += batch { // every dispatcher known, as after its handshake
		s.CheckpointBatch(cps[i:min(i+batch, n)], errs[:min(batch, n-i)])
	}
	order := rand.New(rand.NewPCG(1, 2)).Perm(n)
	round := make([]SinkCheckpoint, batch)
	ts, next := common.Ts(1), 0
	b.ResetTimer()
	for b.Loop() {
		for i := range round {
			if next == n {
				next, ts = 0, ts+1
			}
			round[i] = cps[order[next]]
			round[i].Ts = ts
			next++
		}
		s.CheckpointBatch(round, errs)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*batch), "ns/checkpoint")
}

package tests

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventcollector"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// churnSlot is one dispatcher position; each (re-)add is a new instance
// with a new ID (gen), so a sink call of a removed instance still in flight
// can never be mistaken for the new one's.
type churnSlot struct {
	gen     uint64
	live    bool
	table   int64
	startTs common.Ts
}

func (s *churnSlot) id(n int) common.DispatcherID { return id(s.gen, uint64(n+1)) }

// TestChurn registers, resets and removes dispatchers at random (seeded)
// while the upstream produces. Re-added dispatchers start from a random
// past or present start-ts, so the store shares subscriptions or subscribes
// anew and the upstream replays; resets go through the service with a
// higher epoch and a start-ts at the collector's checkpoint or below it,
// down to the dispatcher's start (forcing a new store registration), and
// the collector answers with its own reset. Every checkpoint of every
// instance is verified against the upstream as it happens; at the end every
// dispatcher still registered holds exactly the upstream's rows from its
// latest start-ts to the final resolved-ts, and the service and the store
// hold exactly the live dispatchers.
func TestChurn(t *testing.T) {
	seed := scenarioSeed(t, 5)
	sc := scale(t)
	tables, initial := 200*sc, 400*sc
	s := &scenario{name: "churn", dispatchers: initial}
	report(t, s)
	h := newHarness(t, harnessConfig{
		seed:            seed,
		tables:          tables,
		rate:            5000,
		duration:        scaled(t, 4*time.Second),
		txnsPerCommitTs: 3,
		ddlEveryTicks:   3,
		storeOpts: func(o *eventstore.Options) {
			// Expire idle subscriptions and collect checkpoints quickly, so
			// re-adds and low resets meet deleted data and must resubscribe.
			o.IdleTTL, o.MaintenanceInterval, o.GCMinSpan, o.GCMaxDelay = 20*time.Millisecond, 5*time.Millisecond, time.Millisecond, 10*time.Millisecond
		},
	})
	rng := rand.New(rand.NewPCG(seed, 3))
	slots := make([]churnSlot, initial)
	for i := range slots {
		slots[i] = churnSlot{gen: 1, live: true, table: int64(i%tables + 1), startTs: h.start}
		require.NoError(t, h.add(slots[i].id(i), slots[i].table, h.start))
	}
	h.run()

	var resets, staleResets, removes, adds int
	for h.gen.ResolvedTs() < h.end {
		pace(2 * time.Millisecond)
		n := rng.IntN(len(slots))
		sl := &slots[n]
		switch action := rng.IntN(10); {
		case !sl.live:
			// Re-add from the workload's start (a full replay) or from the
			// upstream's current frontier.
			sl.gen++
			sl.table = int64(rng.IntN(tables) + 1)
			sl.startTs = h.start
			if rng.IntN(2) == 0 {
				sl.startTs = h.gen.ResolvedTs()
			}
			require.NoError(t, h.add(sl.id(n), sl.table, sl.startTs))
			sl.live = true
			adds++
		case action < 5:
			did := sl.id(n)
			snap, err := h.svc.Inspect(did)
			require.NoError(t, err)
			cs, err := h.coll.Dispatcher(did)
			require.NoError(t, err)
			startTs := cs.Checkpoint
			if rng.IntN(2) == 0 {
				startTs = sl.startTs // below the store's checkpoint: a new registration
			}
			req := messaging.ResetRequest{Dispatcher: did, Registration: snap.Registration, Epoch: snap.Epoch + 1, StartTs: startTs}
			switch err := h.svc.Reset(context.Background(), req); {
			case err == nil:
				resets++
			case errors.Is(err, messaging.ErrStaleEpoch):
				staleResets++ // the collector's own reset won the race
			default:
				require.NoError(t, err)
			}
		case action < 8:
			require.NoError(t, h.remove(sl.id(n)))
			sl.live = false
			removes++
		}
	}
	h.waitDelivered(scaled(t, 3*time.Minute))
	h.requireClean()

	live := 0
	var rows int64
	for n := range slots {
		if sl := &slots[n]; sl.live {
			live++
			rows += int64(h.gen.RowCount(sl.table, sl.startTs, h.end))
			require.Equal(t, h.end, h.chk.checkpoint(sl.id(n)))
		}
	}
	cs := h.coll.Stats()
	s.rows, s.resets = rows, cs.TotalResets()
	s.faults = fmtFaults("%d resets, %d removes, %d re-adds (%d stale resets)", resets, removes, adds, staleResets)
	t.Logf("churn: %s; collector resets by reason %v; live %d", s.faults, cs.Resets, live)
	require.Positive(t, resets)
	require.Positive(t, removes)
	require.Positive(t, adds)
	require.Positive(t, cs.Resets[eventcollector.ResetEpoch], "the collector answered service resets with its own")
	require.Zero(t, cs.Resets[eventcollector.ResetInvalid], "no protocol violation")
	require.Equal(t, live, h.svc.Stats().Dispatchers, "the service holds exactly the live dispatchers")
	require.Equal(t, live, h.store.Stats().Dispatchers, "the store holds exactly the live dispatchers")
	require.Equal(t, live, cs.Dispatchers)
	h.requireBounded()
}

package tests

import (
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/eventcollector"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// TestTransportFaults runs the stack over messaging.Faulty with random
// delays (a send held up to 2ms before its fate is drawn), refusals,
// failures and silent drops, and makes the downstream sink fail now and
// then. Refused and failed sends must back the dispatcher off and re-read
// from the store; a drop must be detected by the collector's seq check (or
// revealed by the service's keepalive when it was the last message) and
// reset the dispatcher; a sink error resets it too. Every checkpoint is
// verified against the upstream, and every dispatcher must recover fully
// up to the final resolved-ts.
func TestTransportFaults(t *testing.T) {
	seed := scenarioSeed(t, 11)
	dispatchers := 500 * scale(t)
	s := &scenario{name: "transport faults (stack)", dispatchers: dispatchers}
	report(t, s)
	delays := newSeededDelay(seed, 0.1, 2*time.Millisecond)
	var faulty *messaging.Faulty
	h := newHarness(t, harnessConfig{
		seed:            seed,
		tables:          dispatchers,
		rate:            5000,
		duration:        scaled(t, 3*time.Second),
		txnsPerCommitTs: 3,
		ddlEveryTicks:   3,
		transport: func(inner messaging.Transport) messaging.Transport {
			var err error
			faulty, err = messaging.NewFaulty(inner, messaging.FaultOptions{Seed: seed, RefuseRate: 0.05, FailRate: 0.03,
				DropRate: 0.02, Delay: delays.delay})
			require.NoError(t, err)
			return faulty
		},
	})
	tables := make([]int64, dispatchers)
	for i := range tables {
		tables[i] = int64(i + 1)
		require.NoError(t, h.add(id(1, uint64(i+1)), tables[i], h.start))
	}
	h.run()
	// Downstream faults: while data flows, make the sink of a random
	// dispatcher fail its next batch, a few times per tick of the upstream.
	rng := rand.New(rand.NewPCG(seed, 2))
	sinkErrors := 0
	for h.gen.ResolvedTs() < h.end {
		h.chk.failNextRows(id(1, uint64(rng.IntN(dispatchers)+1)))
		sinkErrors++
		pace(5 * time.Millisecond)
	}
	h.waitDelivered(scaled(t, 3*time.Minute))
	h.requireClean()

	fs := faulty.Stats()
	cs := h.coll.Stats()
	st := h.chk.stats()
	s.rows, s.resets = rowCount(h.gen, tables, h.start, h.end), cs.TotalResets()
	s.faults = fmtFaults("%d refused, %d failed, %d dropped, %d delayed, %d sink errors", fs.Refused, fs.Failed, fs.Dropped, delays.count(), st.SinkErrors)
	t.Logf("faults: %+v; collector resets by reason %v; sink errors %d", fs, cs.Resets, st.SinkErrors)
	require.Positive(t, fs.Refused)
	require.Positive(t, fs.Failed)
	require.Positive(t, fs.Dropped)
	require.Positive(t, delays.count())
	require.Positive(t, cs.Resets[eventcollector.ResetGap], "drops must be detected by the seq check")
	require.Positive(t, cs.Resets[eventcollector.ResetSinkError], "sink errors reset the dispatcher")
	require.Zero(t, cs.Resets[eventcollector.ResetInvalid], "no protocol violation: only gaps and sink errors cause resets")
	require.Zero(t, cs.Resets[eventcollector.ResetDuplicateHandshake])
	require.GreaterOrEqual(t, st.RowsApplied, uint64(s.rows), "resets re-deliver; nothing is lost")
	h.requireBounded()
}

// pace spaces the actions of a fault or churn injector. It is load
// generation, not synchronisation: only how many actions happen depends on
// it, never what is asserted.
func pace(d time.Duration) { time.Sleep(d) }

// seededDelay holds a fraction of sends for a random time up to max, from
// a seeded source: the injected fault is the delay itself.
type seededDelay struct {
	mu       sync.Mutex
	rng      *rand.Rand
	fraction float64
	max      time.Duration
	n        int
}

func newSeededDelay(seed uint64, fraction float64, maxDelay time.Duration) *seededDelay {
	return &seededDelay{rng: rand.New(rand.NewPCG(seed, 1)), fraction: fraction, max: maxDelay}
}

func (d *seededDelay) delay(messaging.Target, []messaging.Message) {
	d.mu.Lock()
	hold := d.rng.Float64() < d.fraction
	wait := time.Duration(d.rng.Int64N(int64(d.max)))
	if hold {
		d.n++
	}
	d.mu.Unlock()
	if hold {
		time.Sleep(wait)
	}
}

func (d *seededDelay) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n
}

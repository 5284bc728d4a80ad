package tests

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSteadyState runs 1k dispatchers (one per table) on the pebble store
// on disk, a synthetic workload with up to 4 transactions per commit-ts and
// DDLs interleaved at the commit-ts of rows, with a schema frontier that
// trails the upstream. Every checkpoint is verified against the upstream as
// it happens (see checkerForTest); at the end every dispatcher must have
// reached the upstream's final resolved-ts, each row applied exactly once (no
// faults, so no reset may happen), and the queues stayed bounded.
func TestSteadyState(t *testing.T) {
	sc := scale(t)
	dispatchers := 1000 * sc
	s := &scenario{name: "steady state", dispatchers: dispatchers, faults: "none"}
	report(t, s)
	h := newHarness(t, harnessConfig{
		seed:            scenarioSeed(t, 1),
		tables:          dispatchers,
		rate:            6000,
		duration:        scaled(t, 3*time.Second),
		txnsPerCommitTs: 4,
		ddlEveryTicks:   2,
		onDisk:          true,
	})
	tables := make([]int64, dispatchers)
	for i := range tables {
		tables[i] = int64(i + 1)
		require.NoError(t, h.add(id(1, uint64(i+1)), tables[i], h.start))
	}
	h.run()
	h.waitDelivered(scaled(t, 3*time.Minute))
	h.requireClean()

	want := rowCount(h.gen, tables, h.start, h.end)
	st := h.chk.stats()
	s.rows, s.resets = want, h.coll.Stats().TotalResets()
	require.Positive(t, want)
	require.Equal(t, uint64(want), st.RowsApplied, "every row applied exactly once")
	require.Zero(t, s.resets, "no fault, no reset: a reset would mean a protocol violation")
	require.Equal(t, uint64(h.ddls.len()), st.DDLsApplied, "every DDL applied once")
	require.Positive(t, h.ddls.len())
	p := h.requireBounded()
	require.Greater(t, p.notifications, uint64(dispatchers), "notifications outnumber dispatchers, so the queue bound is not trivial")
	t.Logf("rows %d, DDLs %d, checkpoints %d, notifications %d", want, h.ddls.len(), st.Checkpoints, p.notifications)
}

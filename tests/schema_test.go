package tests

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/common"
)

// TestSchemaStalls stops the schema frontier while the upstream keeps
// producing, then lets it advance. Rows must never be delivered beyond the
// schema frontier (the checker fails any checkpoint above it), dispatchers
// meeting the frontier park as schema-blocked, and a parked dispatcher must
// be retried when the frontier advances, without waiting for a store
// notification.
//
// The last stall is the proof: the upstream has reached its end, so the
// store has notified everything it ever will; every dispatcher is parked at
// the stalled frontier. Then the frontier advances once, to the end, and
// every dispatcher must catch up while the store's notification count
// stays where it was.
func TestSchemaStalls(t *testing.T) {
	seed := scenarioSeed(t, 9)
	dispatchers := 300 * scale(t)
	s := &scenario{name: "schema stalls", dispatchers: dispatchers, faults: "2 schema stalls"}
	report(t, s)
	h := newHarness(t, harnessConfig{
		seed:            seed,
		tables:          dispatchers,
		rate:            5000,
		duration:        scaled(t, 3*time.Second),
		txnsPerCommitTs: 3,
		ddlEveryTicks:   2,
		manualSchema:    true,
	})
	tables := make([]int64, dispatchers)
	ids := make([]common.DispatcherID, dispatchers)
	for i := range tables {
		tables[i], ids[i] = int64(i+1), id(1, uint64(i+1))
		require.NoError(t, h.add(ids[i], tables[i], h.start))
	}
	h.run()
	span := h.end - h.start
	follow := func(until common.Ts) {
		// Trail the upstream's frontier until it passes until.
		for {
			f := h.gen.ResolvedTs()
			require.NoError(t, advanceSchema(h.schema, h.plan, h.ddls, f))
			if f >= until {
				return
			}
			pace(5 * time.Millisecond)
		}
	}

	// Stall 1, while data flows: dispatchers park, then resume.
	follow(h.start + span/3)
	stall1 := h.schema.ResolvedTs()
	testwait.Within(t, time.Minute, "dispatchers parked at the first stall", func() bool {
		return h.gen.ResolvedTs() > stall1 && h.svc.Stats().SchemaBlocked > 0
	})
	blocked1 := h.svc.Stats().SchemaBlocked
	follow(h.start + 2*span/3)

	// Stall 2, until the upstream has ended and everything is parked. It
	// cuts the next tick at the commit-ts of a row, so a commit-ts group
	// must be delivered whole and nothing after it.
	stall2 := h.schema.ResolvedTs()
	next := common.ComposeTs(stall2.PhysicalMs()+h.cfg.tick.Milliseconds(), 0)
	for _, table := range tables {
		if rows := h.gen.Rows(table, stall2, next); len(rows) > 0 {
			stall2 = rows[len(rows)/2].CommitTs
			break
		}
	}
	require.NoError(t, advanceSchema(h.schema, h.plan, h.ddls, stall2))
	require.Less(t, stall2, h.end)
	testwait.Within(t, scaled(t, 2*time.Minute), "every dispatcher parked at the final stall with all notifications received", func() bool {
		if h.gen.ResolvedTs() < h.end || h.svc.Stats().SchemaBlocked < dispatchers {
			return false
		}
		for _, did := range ids {
			snap, err := h.svc.Inspect(did)
			if err != nil || snap.Received < h.end || h.chk.checkpoint(did) < stall2 {
				return false
			}
		}
		return true
	})
	h.requireClean()
	for _, did := range ids {
		require.Equal(t, stall2, h.chk.checkpoint(did), "delivered exactly up to the stalled schema frontier")
	}
	notifies := h.store.Stats().NotifyCount
	svcNotifies := h.svc.Progress().Notifications

	// One advance; no store notification may be needed to finish.
	require.NoError(t, advanceSchema(h.schema, h.plan, h.ddls, h.end))
	h.waitDelivered(scaled(t, 2*time.Minute))
	h.requireClean()
	require.Equal(t, notifies, h.store.Stats().NotifyCount, "no store notification after the upstream ended")
	require.Equal(t, svcNotifies, h.svc.Progress().Notifications)
	require.Zero(t, h.svc.Stats().SchemaBlocked)

	st := h.chk.stats()
	s.rows, s.resets = rowCount(h.gen, tables, h.start, h.end), h.coll.Stats().TotalResets()
	require.Equal(t, uint64(s.rows), st.RowsApplied, "every row applied exactly once")
	require.Zero(t, s.resets)
	require.Equal(t, uint64(h.ddls.len()), st.DDLsApplied)
	t.Logf("stall 1 at %v parked %d dispatchers; stall 2 at %v parked all %d; %d store notifications before the final advance, none after",
		stall1, blocked1, stall2, dispatchers, notifies)
	h.requireBounded()
}

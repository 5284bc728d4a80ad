package eventstore

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
)

// TestFreshRowsScanAsPebbleDoes drives two stores with the same pushes,
// checkpoints and scans: one keeps fresh rows (with a small per-subscription
// allowance, so that rows are evicted and scans fall back to pebble), the
// other has none and reads pebble for every scan. Every scan must return the
// same rows, transaction starts included: transactions whose rows arrive out
// of key order, two transactions at one commit-ts, a key written twice in a
// transaction (the later wins), commits pushed out of order below a
// resolved-ts, ranges resumed after a cursor, and checkpoints that trim.
func TestFreshRowsScanAsPebbleDoes(t *testing.T) {
	fresh := newTestEnv(t, func(o *Options) { o.FreshSubscriptionBytes = 2 << 10 })
	plain := newTestEnv(t, func(o *Options) { o.FreshBytes = -1 })
	span := common.Span{TableID: 1, StartKey: []byte("a"), EndKey: []byte("z")}
	envs := []*testEnv{fresh, plain}
	recs := make([]*recorder, len(envs))
	for i, env := range envs {
		recs[i] = newRecorder()
		require.NoError(t, env.store.RegisterDispatcher(did(1), span, 100, recs[i]))
	}
	rng := rand.New(rand.NewPCG(20, 26))
	resolved, checkpoint := common.Ts(100), common.Ts(100)
	for round := range 300 {
		// A push of a few transactions above resolved, in any commit order.
		var rows []common.Row
		for range rng.IntN(4) {
			commit := resolved + 1 + common.Ts(rng.IntN(20))
			start := commit - 1 - common.Ts(rng.IntN(2)) // two transactions may share a commit-ts
			for range 1 + rng.IntN(6) {
				k := fmt.Sprintf("k%02d", rng.IntN(30)) // out of key order, sometimes twice
				rows = append(rows, common.Row{Op: common.OpPut, Key: []byte(k),
					Value: fmt.Appendf(nil, "v%d-%s-%d", round, k, len(rows)), StartTs: start, CommitTs: commit})
			}
		}
		next := resolved + 20
		for i, env := range envs {
			push(t, env.up.last(t, span), next, rows...)
			recs[i].waitResolved(t, next)
		}
		resolved = next
		if rng.IntN(4) == 0 {
			checkpoint = checkpoint + common.Ts(rng.IntN(int(resolved-checkpoint)+1))
			for _, env := range envs {
				require.NoError(t, env.store.UpdateCheckpoint(did(1), checkpoint))
			}
		}
		for range 3 {
			r := ScanRange{Start: checkpoint + common.Ts(rng.IntN(int(resolved-checkpoint)+1))}
			r.End = r.Start + common.Ts(rng.IntN(int(resolved-r.Start)+1))
			want, wantTxns := scan(t, plain.store, did(1), r)
			if len(want) > 0 && rng.IntN(2) == 0 {
				w := want[rng.IntN(len(want))]
				if w.CommitTs > r.Start {
					r.After = &Cursor{CommitTs: w.CommitTs, StartTs: w.StartTs}
					if rng.IntN(2) == 0 {
						r.After.Key = w.Key
					}
					want, wantTxns = scan(t, plain.store, did(1), r)
				}
			}
			got, gotTxns := scan(t, fresh.store, did(1), r)
			require.Equal(t, want, got, "round %d range %+v", round, r)
			require.Equal(t, wantTxns, gotTxns, "round %d range %+v", round, r)
		}
	}
	// Both paths ran: scans served from memory, and scans that were not
	// (below an eviction).
	require.Positive(t, testutil.ToFloat64(fresh.store.metrics.scansFresh))
	require.Positive(t, testutil.ToFloat64(fresh.store.metrics.scansPebble))
	require.Zero(t, testutil.ToFloat64(plain.store.metrics.scansFresh))
}

// TestFreshRowsStayWithinTheirBudget: with many subscriptions the fresh
// rows never exceed FreshBytes (a subscription that cannot reserve room
// drops its rows, and its scans read pebble), a checkpoint at resolved-ts
// gives a subscription's rows back, and so does its removal.
func TestFreshRowsStayWithinTheirBudget(t *testing.T) {
	const budget = 8 << 10
	env := newTestEnv(t, func(o *Options) { o.FreshBytes, o.FreshSubscriptionBytes = budget, 2<<10 })
	s := env.store
	const tables = 20
	recs := make([]*recorder, tables)
	spans := make([]common.Span, tables)
	for i := range tables {
		recs[i] = newRecorder()
		spans[i] = common.Span{TableID: int64(i + 1), StartKey: fmt.Appendf(nil, "t%02d", i), EndKey: fmt.Appendf(nil, "t%02d~", i)}
		require.NoError(t, s.RegisterDispatcher(did(uint64(i+1)), spans[i], 100, recs[i]))
	}
	resolved := common.Ts(100)
	for round := range 20 {
		resolved += 10
		for i := range tables {
			row := common.Row{Op: common.OpPut, Key: fmt.Appendf(nil, "t%02d-%03d", i, round), Value: make([]byte, 100),
				StartTs: resolved - 2, CommitTs: resolved - 1}
			push(t, env.up.last(t, spans[i]), resolved, row)
			recs[i].waitResolved(t, resolved)
			require.LessOrEqual(t, s.fresh.used.Load(), int64(budget))
		}
	}
	require.Positive(t, testutil.ToFloat64(s.metrics.freshDropped), "the budget was never short: the test proves nothing")
	// Every table still scans all its rows, whatever served them.
	for i := range tables {
		rows, _ := scan(t, s, did(uint64(i+1)), ScanRange{Start: 100, End: resolved})
		require.Len(t, rows, 20)
	}
	require.Positive(t, s.fresh.used.Load())
	for i := range tables {
		require.NoError(t, s.UpdateCheckpoint(did(uint64(i+1)), resolved))
	}
	require.Zero(t, s.fresh.used.Load(), "a checkpoint at resolved-ts leaves nothing to scan")

	// A removed subscription gives its rows back.
	resolved += 10
	push(t, env.up.last(t, spans[0]), resolved, put("t00-new", resolved-2, resolved-1))
	recs[0].waitResolved(t, resolved)
	require.Positive(t, s.fresh.used.Load())
	require.NoError(t, s.UnregisterDispatcher(did(1)))
	env.clk.Advance(2 * s.opts.IdleTTL)
	s.maintain()
	require.Zero(t, s.fresh.used.Load())
}

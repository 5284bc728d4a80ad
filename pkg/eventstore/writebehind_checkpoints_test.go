package eventstore

import (
	"fmt"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
)

// spillCheckpoints are the minimum checkpoints the spill tests try against
// rows a, b and c held in memory only at commit-ts 10, 20 and 30, the
// other dispatcher of the span being at 30: at a's commit-ts, one below
// b's (b is then the first row above the floor a spill writes from), and
// at b's. want is what a scan from the checkpoint reads of them.
var spillCheckpoints = []struct {
	min  common.Ts
	want []string // what a scan from min reads, the rows above it
}{
	{10, []string{"b", "c"}},
	{19, []string{"b", "c"}},
	{20, []string{"c"}},
}

// TestAPushThatDoesNotFitWritesEveryHeldRowAboveTheMinimumCheckpoint:
// two dispatchers share a write-behind subscription whose rows a@10, b@20
// and c@30 are held in memory only; one checkpoints 30, the other less (10,
// 19 or 20). A push too large for the subscription's allowance then moves
// the fresh floor above both checkpoints, so the push writes the held rows
// to pebble in its own batch first, and the dispatcher behind, scanning
// from its checkpoint, now reads pebble: it must find there every held row
// above the MINIMUM checkpoint (a floor at the other dispatcher's
// checkpoint, or one past the minimum, loses rows it still needs).
func TestAPushThatDoesNotFitWritesEveryHeldRowAboveTheMinimumCheckpoint(t *testing.T) {
	for _, tc := range spillCheckpoints {
		t.Run(fmt.Sprintf("min_checkpoint=%v", tc.min), func(t *testing.T) {
			env := newTestEnv(t, func(o *Options) { o.WriteWorkers = 1; o.FreshSubscriptionBytes = 1000 })
			span := common.TableSpan(1)
			ahead, behind := newRecorder(), newRecorder()
			require.NoError(t, env.store.RegisterDispatcher(did(1), span, 0, ahead))
			require.NoError(t, env.store.RegisterDispatcher(did(2), span, 0, behind))
			sub := env.up.last(t, span)
			push(t, sub, 30, put("a", 5, 10), put("b", 15, 20), put("c", 25, 30))
			ahead.waitResolved(t, 30)
			behind.waitResolved(t, 30)
			require.Zero(t, countRaw(t, env.store, sub), "the rows are held in memory only")

			require.NoError(t, env.store.UpdateCheckpoint(did(1), 30))
			require.NoError(t, env.store.UpdateCheckpoint(did(2), tc.min))
			push(t, sub, 50, sized("d", 35, 40, "d", 2000)) // over the allowance: the floor moves to 40
			ahead.waitResolved(t, 50)
			behind.waitResolved(t, 50)

			got, _ := scan(t, env.store, did(2), ScanRange{Start: tc.min, End: 50})
			require.Equal(t, append(append([]string(nil), tc.want...), "d"), keysOf(got))
			require.Equal(t, 1.0, testutil.ToFloat64(env.store.metrics.scansPebble), "the scan is below the floor: pebble")
			got, _ = scan(t, env.store, did(1), ScanRange{Start: 30, End: 50})
			require.Equal(t, []string{"d"}, keysOf(got))
			require.Equal(t, float64(len(tc.want)), testutil.ToFloat64(env.store.metrics.rowsSpilled),
				"the held rows above the minimum checkpoint were written before d, and no other")
		})
	}
}

// TestHeldRowsRefusedTheStoresBudgetAreWrittenAboveTheMinimumCheckpoint:
// the same shared subscription (span 2; held rows a@10, b@20, c@30;
// checkpoints 30 and 10, 19 or 20) gets a push that fits its own
// allowance and the store's budget when apply defers it, in one write
// batch behind another subscription's push that fits too, but not beside
// it: publishing the other push first takes the room, so publishing this
// one writes what the subscription holds in memory only (spillLocked)
// before it drops it. The dispatcher behind scans pebble from its
// checkpoint and must find every held row above the MINIMUM checkpoint.
func TestHeldRowsRefusedTheStoresBudgetAreWrittenAboveTheMinimumCheckpoint(t *testing.T) {
	for _, tc := range spillCheckpoints {
		t.Run(fmt.Sprintf("min_checkpoint=%v", tc.min), func(t *testing.T) {
			env := newTestEnv(t, func(o *Options) {
				o.WriteWorkers, o.FreshBytes, o.FreshSubscriptionBytes = 1, 1000, 1300
			})
			rx, ahead, behind := newRecorder(), newRecorder(), newRecorder()
			notify, entered, release := holdWorker(rx)
			require.NoError(t, env.store.RegisterDispatcher(did(1), common.TableSpan(1), 0, NotifierFunc(notify)))
			require.NoError(t, env.store.RegisterDispatcher(did(2), common.TableSpan(2), 0, ahead))
			require.NoError(t, env.store.RegisterDispatcher(did(3), common.TableSpan(2), 0, behind))
			x, y := env.up.last(t, common.TableSpan(1)), env.up.last(t, common.TableSpan(2))
			push(t, y, 30, put("a", 5, 10), put("b", 15, 20), put("c", 25, 30))
			ahead.waitResolved(t, 30)
			behind.waitResolved(t, 30)
			require.NoError(t, env.store.UpdateCheckpoint(did(2), 30))
			require.NoError(t, env.store.UpdateCheckpoint(did(3), tc.min))
			require.Zero(t, countRaw(t, env.store, y), "the rows are held in memory only")

			push(t, x, 5)
			<-entered                                    // the write worker is held: what follows is one batch
			push(t, x, 10, sized("x", 9, 10, "x", 500))  // costs about 600: fits
			push(t, y, 50, sized("y", 35, 40, "y", 250)) // fits alone, not beside x
			close(release)
			rx.waitResolved(t, 10)
			ahead.waitResolved(t, 50)
			behind.waitResolved(t, 50)

			got, _ := scan(t, env.store, did(3), ScanRange{Start: tc.min, End: 50})
			require.Equal(t, append(append([]string(nil), tc.want...), "y"), keysOf(got))
			require.Equal(t, 1.0, testutil.ToFloat64(env.store.metrics.scansPebble), "y dropped its fresh rows: pebble")
			require.Equal(t, float64(len(tc.want)+1), testutil.ToFloat64(env.store.metrics.rowsSpilled),
				"the held rows above the minimum checkpoint, then y, written when y was refused room")
			require.Zero(t, countRaw(t, env.store, x), "x kept its room: held in memory only")
		})
	}
}

// TestRowsAboveAFloorOneAboveTheMinimumCheckpointAreWrittenAtTheirCommit:
// the boundary of write-behind. A push too large for the allowance moves
// the fresh floor to 40; with the checkpoint at 39, one below the floor, a
// scan from the checkpoint reads pebble, so a later row (e@45) must be
// written at its commit, not held in memory only. With the checkpoint at
// the floor (40) every scan is served from memory again, and a later row
// (f@55) is held there only.
func TestRowsAboveAFloorOneAboveTheMinimumCheckpointAreWrittenAtTheirCommit(t *testing.T) {
	env := newTestEnv(t, func(o *Options) { o.WriteWorkers = 1; o.FreshSubscriptionBytes = 1000 })
	span := common.TableSpan(1)
	r := newRecorder()
	require.NoError(t, env.store.RegisterDispatcher(did(1), span, 0, r))
	sub := env.up.last(t, span)
	push(t, sub, 40, sized("d", 35, 40, "d", 2000)) // over the allowance: written, the floor moves to 40
	r.waitResolved(t, 40)
	require.Equal(t, 1, countRaw(t, env.store, sub))

	// Checkpoint one below the floor: not write-behind.
	require.NoError(t, env.store.UpdateCheckpoint(did(1), 39))
	push(t, sub, 50, put("e", 44, 45))
	r.waitResolved(t, 50)
	got, _ := scan(t, env.store, did(1), ScanRange{Start: 39, End: 50})
	require.Equal(t, []string{"d", "e"}, keysOf(got))
	require.Equal(t, 1.0, testutil.ToFloat64(env.store.metrics.scansPebble), "a scan below the floor reads pebble")
	require.Equal(t, 2, countRaw(t, env.store, sub), "e is written at its commit")
	require.Zero(t, testutil.ToFloat64(env.store.metrics.rowsDeferred))

	// Checkpoint at the floor: write-behind again.
	require.NoError(t, env.store.UpdateCheckpoint(did(1), 40))
	push(t, sub, 60, put("f", 54, 55))
	r.waitResolved(t, 60)
	got, _ = scan(t, env.store, did(1), ScanRange{Start: 40, End: 60})
	require.Equal(t, []string{"e", "f"}, keysOf(got))
	require.Equal(t, 1.0, testutil.ToFloat64(env.store.metrics.scansPebble), "a scan from the floor reads memory")
	require.Equal(t, 2, countRaw(t, env.store, sub), "f is held in memory only")
	require.Equal(t, 1.0, testutil.ToFloat64(env.store.metrics.rowsDeferred))
}

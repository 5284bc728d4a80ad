package eventstore

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
)

// TestRowsCheckpointedWhileFreshAreNeverWritten: the rows of a subscription
// whose every scan reads memory are kept there only; the dispatcher scans
// them, checkpoints them, and pebble never holds them.
func TestRowsCheckpointedWhileFreshAreNeverWritten(t *testing.T) {
	env := newTestEnv(t, nil)
	span := common.TableSpan(1)
	r := newRecorder()
	require.NoError(t, env.store.RegisterDispatcher(did(1), span, 0, r))
	sub := env.up.last(t, span)
	push(t, sub, 30, put("a", 5, 10), put("b", 15, 20), put("c", 25, 30))
	r.waitResolved(t, 30)

	// A second dispatcher may join at or above the low watermark: its scan
	// reads memory too.
	r2 := newRecorder()
	require.NoError(t, env.store.RegisterDispatcher(did(2), span, 0, r2))
	for _, id := range []common.DispatcherID{did(1), did(2)} {
		got, _ := scan(t, env.store, id, ScanRange{Start: 0, End: 30})
		require.Equal(t, []string{"a", "b", "c"}, keysOf(got))
	}
	require.Zero(t, countRaw(t, env.store, sub), "no row was written to pebble")
	require.Equal(t, 3.0, testutil.ToFloat64(env.store.metrics.rowsDeferred))

	require.NoError(t, env.store.UpdateCheckpoint(did(1), 30))
	require.NoError(t, env.store.UpdateCheckpoint(did(2), 20))
	got, _ := scan(t, env.store, did(2), ScanRange{Start: 20, End: 30})
	require.Equal(t, []string{"c"}, keysOf(got))
	require.NoError(t, env.store.UpdateCheckpoint(did(2), 30))
	require.Zero(t, countRaw(t, env.store, sub))
	require.Zero(t, testutil.ToFloat64(env.store.metrics.rowsWritten))
	require.Zero(t, testutil.ToFloat64(env.store.metrics.rowsSpilled))
}

// holdWorker returns a notifier that blocks the (single) write worker in
// its first call until release is closed, so that the pushes made
// meanwhile land in one write batch, and then records into r.
func holdWorker(r *recorder) (notify func(resolved, maxCommit common.Ts), entered, release chan struct{}) {
	entered, release = make(chan struct{}), make(chan struct{})
	first := true
	return func(resolved, maxCommit common.Ts) {
		if first { // only the write worker calls it, one call at a time
			first = false
			close(entered)
			<-release
		}
		r.Notify(resolved, maxCommit)
	}, entered, release
}

func sized(key string, startTs, commitTs common.Ts, value string, n int) common.Row {
	row := put(key, startTs, commitTs)
	row.Value = []byte(value + strings.Repeat(".", n-len(value)))
	return row
}

// TestAPushThatDoesNotFitIsWrittenAfterTheRowsHeldInMemory: a version of a
// row kept in memory only, then a later version of the same (commit-ts,
// start-ts, key) too large for the allowance, in a later write batch and
// in the same one. The later push writes what was held in memory first, in
// its own batch, so pebble keeps the later version, which a scan below the
// new floor reads (a spill after the later version's commit put the
// earlier one back).
func TestAPushThatDoesNotFitIsWrittenAfterTheRowsHeldInMemory(t *testing.T) {
	for _, oneBatch := range []bool{false, true} {
		t.Run(fmt.Sprintf("one_batch=%v", oneBatch), func(t *testing.T) {
			env := newTestEnv(t, func(o *Options) { o.WriteWorkers = 1; o.FreshSubscriptionBytes = 1000 })
			span := common.TableSpan(1)
			r := newRecorder()
			notify, entered, release := holdWorker(r)
			require.NoError(t, env.store.RegisterDispatcher(did(1), span, 0, NotifierFunc(notify)))
			sub := env.up.last(t, span)
			push(t, sub, 5)
			<-entered
			push(t, sub, 6, sized("k", 9, 10, "v1", 100)) // kept in memory only
			if !oneBatch {
				close(release)
				r.waitResolved(t, 6)
				require.Equal(t, 1.0, testutil.ToFloat64(env.store.metrics.rowsDeferred))
				require.Zero(t, countRaw(t, env.store, sub))
			}
			push(t, sub, 20, sized("k", 9, 10, "v2", 2000)) // over the allowance: the floor moves to 10
			if oneBatch {
				close(release)
			}
			r.waitResolved(t, 20)
			got, _ := scan(t, env.store, did(1), ScanRange{Start: 0, End: 20}) // below the floor: pebble
			require.Len(t, got, 1)
			require.True(t, strings.HasPrefix(string(got[0].Value), "v2"), "the later version: %.8q", got[0].Value)
			require.Equal(t, 1.0, testutil.ToFloat64(env.store.metrics.scansPebble))
			m := env.store.metrics
			accepted := testutil.ToFloat64(m.rowsWritten) - testutil.ToFloat64(m.rowsSpilled) + testutil.ToFloat64(m.rowsDeferred)
			require.Equal(t, 2.0, accepted, "written - spilled + deferred counts each accepted row once")
		})
	}
}

// TestRowsDeferredThenRefusedByTheStoresBudgetAreWritten: two
// subscriptions' pushes in one write batch each fit the store's budget when
// apply defers them, and not together. The second subscription's first push
// is refused room when it is published, so its rows held in memory only
// are written before it drops them; its second push, deferred before that,
// is written then too (from is above its checkpoint by then). A scan below
// the floor finds both in pebble.
func TestRowsDeferredThenRefusedByTheStoresBudgetAreWritten(t *testing.T) {
	env := newTestEnv(t, func(o *Options) {
		o.WriteWorkers, o.FreshBytes, o.FreshSubscriptionBytes, o.GCMinSpan = 1, 1000, 1300, time.Millisecond
	})
	ms := func(n int64) common.Ts { return common.ComposeTs(1_700_000_000_000+n, 0) }
	rx, ry := newRecorder(), newRecorder()
	notify, entered, release := holdWorker(rx)
	require.NoError(t, env.store.RegisterDispatcher(did(1), common.TableSpan(1), 0, NotifierFunc(notify)))
	require.NoError(t, env.store.RegisterDispatcher(did(2), common.TableSpan(2), 0, ry))
	x, y := env.up.last(t, common.TableSpan(1)), env.up.last(t, common.TableSpan(2))
	push(t, x, ms(5))
	<-entered
	push(t, x, ms(10), sized("x", ms(9), ms(10), "x", 500))   // costs about 600: fits
	push(t, y, ms(10), sized("y1", ms(9), ms(10), "y1", 500)) // fits alone, not beside x
	push(t, y, ms(20), sized("y2", ms(19), ms(20), "y2", 250))
	close(release)
	rx.waitResolved(t, ms(10))
	ry.waitResolved(t, ms(20))

	require.Equal(t, 3.0, testutil.ToFloat64(env.store.metrics.rowsDeferred))
	require.Equal(t, 2.0, testutil.ToFloat64(env.store.metrics.rowsSpilled), "y's rows, written when they had to be")
	require.Zero(t, countRaw(t, env.store, x))
	require.Equal(t, 2, countRaw(t, env.store, y))
	got, _ := scan(t, env.store, did(2), ScanRange{Start: 0, End: ms(20)})
	require.Equal(t, []string{"y1", "y2"}, keysOf(got))
	require.Equal(t, 1.0, testutil.ToFloat64(env.store.metrics.scansPebble))

	// GC knows the spilled rows are in pebble: their range is deleted;
	// x's, in memory only, costs no deletion.
	require.NoError(t, env.store.UpdateCheckpoint(did(1), ms(10)))
	require.NoError(t, env.store.UpdateCheckpoint(did(2), ms(20)))
	env.store.maintain()
	require.Equal(t, 1.0, testutil.ToFloat64(env.store.metrics.gcRangesDeleted))
	require.Equal(t, 1, countRaw(t, env.store, y), "y1 is deleted; y2, at the checkpoint, stays")
}

// TestGCDeletesNothingWherePebbleHoldsNothing: checkpoints of a
// write-behind subscription whose rows were read from memory move its GC
// mark without a range deletion (pebble holds none of them, and a
// tombstone per table would cost every iterator); once rows were spilled
// to pebble, their range is deleted.
func TestGCDeletesNothingWherePebbleHoldsNothing(t *testing.T) {
	env := newTestEnv(t, func(o *Options) { o.GCMinSpan = time.Millisecond; o.FreshSubscriptionBytes = 1000 })
	span := common.TableSpan(1)
	r := newRecorder()
	require.NoError(t, env.store.RegisterDispatcher(did(1), span, 0, r))
	sub := env.up.last(t, span)
	ms := func(n int64) common.Ts { return common.ComposeTs(1_700_000_000_000+n, 0) }
	push(t, sub, ms(10), put("a", ms(5), ms(5)+1))
	r.waitResolved(t, ms(10))
	require.NoError(t, env.store.UpdateCheckpoint(did(1), ms(10)))
	env.store.maintain()
	require.Zero(t, testutil.ToFloat64(env.store.metrics.gcRangesDeleted), "nothing in pebble, no tombstone")

	// Over the allowance: the rows go to pebble, and GC deletes them.
	push(t, sub, ms(20), sized("b", ms(15), ms(15)+1, "b", 2000))
	r.waitResolved(t, ms(20))
	require.Equal(t, 1, countRaw(t, env.store, sub))
	require.NoError(t, env.store.UpdateCheckpoint(did(1), ms(20)))
	env.store.maintain()
	require.Equal(t, 1.0, testutil.ToFloat64(env.store.metrics.gcRangesDeleted))
	require.Zero(t, countRaw(t, env.store, sub))
}

package eventstore

import (
	"bytes"
	"testing"

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
	require.NoError(t, env.store.RegisterDispatcher(did(1), span, 0, r.notify))
	sub := env.up.last(t, span)
	push(t, sub, 30, put("a", 5, 10), put("b", 15, 20), put("c", 25, 30))
	r.waitResolved(t, 30)

	// A second dispatcher may join at or above the low watermark: its scan
	// reads memory too.
	r2 := newRecorder()
	require.NoError(t, env.store.RegisterDispatcher(did(2), span, 0, r2.notify))
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

// TestRowsHeldInMemoryAreWrittenBeforeTheyLeaveIt: four pushes of one
// write batch are each kept out of pebble (each fits the subscription's
// allowance alone). The third evicts the first two, which moves the fresh
// floor above the checkpoint, so the rows held only in memory must be
// written before a scan from the checkpoint goes to pebble: the three
// there, and the fourth's, which apply deferred before the eviction
// happened. The write worker is held in a notifier so that the four pushes
// land in one batch.
func TestRowsHeldInMemoryAreWrittenBeforeTheyLeaveIt(t *testing.T) {
	env := newTestEnv(t, func(o *Options) { o.WriteWorkers = 1; o.FreshSubscriptionBytes = 1000 })
	span := common.TableSpan(1)
	entered, release := make(chan struct{}), make(chan struct{})
	r := newRecorder()
	first := true
	notify := func(resolved, maxCommit common.Ts) {
		if first { // only the write worker calls it, one call at a time
			first = false
			close(entered)
			<-release
		}
		r.notify(resolved, maxCommit)
	}
	require.NoError(t, env.store.RegisterDispatcher(did(1), span, 0, notify))
	sub := env.up.last(t, span)
	push(t, sub, 5)
	<-entered // the worker waits in the notifier: what follows queues
	big := func(key string, commit common.Ts) common.Row {
		row := put(key, commit-1, commit)
		row.Value = bytes.Repeat([]byte{'v'}, 300) // about 40% of the allowance
		return row
	}
	push(t, sub, 10, big("b", 10))
	push(t, sub, 20, big("c", 20))
	push(t, sub, 30, big("d", 30))
	push(t, sub, 40, big("e", 40))
	close(release)
	r.waitResolved(t, 40)

	require.Equal(t, 4.0, testutil.ToFloat64(env.store.metrics.rowsDeferred), "each push was deferred")
	require.Equal(t, 4.0, testutil.ToFloat64(env.store.metrics.rowsSpilled), "and each was written before it could be missed")
	require.Equal(t, 4, countRaw(t, env.store, sub))
	got, _ := scan(t, env.store, did(1), ScanRange{Start: 0, End: 40}) // below the floor: pebble
	require.Equal(t, []string{"b", "c", "d", "e"}, keysOf(got))
	require.Equal(t, 1.0, testutil.ToFloat64(env.store.metrics.scansPebble))

	// A checkpoint that reaches the floor makes the subscription
	// write-behind again: the next row is not written.
	require.NoError(t, env.store.UpdateCheckpoint(did(1), 40))
	push(t, sub, 50, put("f", 45, 50))
	r.waitResolved(t, 50)
	require.Equal(t, 4, countRaw(t, env.store, sub))
	got, _ = scan(t, env.store, did(1), ScanRange{Start: 40, End: 50})
	require.Equal(t, []string{"f"}, keysOf(got))
}

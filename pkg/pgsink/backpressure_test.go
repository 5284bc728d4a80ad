package pgsink

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// waitWarmedUp waits until the lanes' warm-up of the n tables bound is
// over (warm.go): a warm-up pipeline takes its tables' locks too, and a
// test that holds a table must see its lane's commit wait for it, not a
// warm-up.
func waitWarmedUp(t *testing.T, e *sinkEnv, n int) {
	t.Helper()
	testwait.Within(t, time.Minute, "the lanes' warm-up is over", func() bool {
		return testutil.ToFloat64(e.sink.met.warmed)+testutil.ToFloat64(e.sink.met.warmFailures) >= float64(n)
	})
}

// holdTable locks table in ACCESS EXCLUSIVE mode (as an ALTER TABLE
// would) in a transaction on the test's connection, and returns it; the
// caller rolls it back to release the table. e.conn is the transaction's
// until then.
func holdTable(t *testing.T, e *sinkEnv, table string) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	hold, err := e.conn.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = hold.Rollback(context.Background()) }) // after a Rollback a no-op
	_, err = hold.Exec(ctx, "LOCK TABLE "+table+" IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)
	return hold
}

// waitCommitBlockedOn waits until a session waits for a lock on table:
// with the warm-up over, the lane's commit.
func waitCommitBlockedOn(t *testing.T, e *sinkEnv, table string) {
	t.Helper()
	watch, err := pgx.Connect(context.Background(), e.pg.DSN)
	require.NoError(t, err)
	defer watch.Close(context.Background())
	waitServer(t, watch, "the lane's commit waiting for "+table,
		"SELECT count(*) FROM pg_locks WHERE locktype = 'relation' AND relation = '"+table+"'::regclass AND NOT granted")
}

// A lane holds at most QueueRows queued rows: with its commit blocked (the
// target table locked by another session), rows up to the bound are
// queued and ApplyRows returns, the next ApplyRows waits for room and
// does not return while the lock is held; once the table is released the
// commit goes in, the lane takes the queue, the waiting call returns and
// every row is applied in call order. The interleaving: the lane takes
// two rows (BatchRows) and its commit waits for the table (seen in
// pg_locks); two more rows fill the queue (QueueRows 2); a third waits in
// the lane's enqueue (seen by the enqueueWaits knob) and has not returned;
// the lock is released. Without the bound, the third call would return at
// once and a lane whose target is slow would queue without limit.
func TestApplyRowsWaitsWhileTheLaneHoldsQueueRows(t *testing.T) {
	e := newSinkEnv(t, func(o *Options) { o.Workers = 1; o.BatchRows = 2; o.QueueRows = 2 })
	ctx := context.Background()
	id := common.DispatcherIDFromUint64(1)
	e.firstRow(id) // id 1 = "a" at 12
	e.dur.wait(t, id, 12)
	waitWarmedUp(t, e, 1)

	hold := holdTable(t, e, "app.t")
	// Two rows: BatchRows, so the lane commits them at once; the commit
	// waits for the table.
	require.NoError(t, e.sink.ApplyRows(id, rows(14,
		tx(pgcodec.Insert, col("id", "2"), col("v", "b"), null("big")),
		tx(pgcodec.Update, col("id", "1"), col("v", "a2"), null("big")))))
	require.NoError(t, e.sink.Checkpoint(id, 14))
	waitCommitBlockedOn(t, e, "app.t")

	// The lane is in its commit and takes nothing: two rows fill its queue.
	require.NoError(t, e.sink.ApplyRows(id, rows(16,
		tx(pgcodec.Insert, col("id", "3"), col("v", "c"), null("big")),
		tx(pgcodec.Update, col("id", "1"), col("v", "a3"), null("big")))))
	require.NoError(t, e.sink.Checkpoint(id, 16))

	// One more row is beyond the bound: the call waits.
	waiting := make(chan struct{})
	var once sync.Once
	e.sink.knobs.enqueueWaits = func() { once.Do(func() { close(waiting) }) } // before the call that reads it
	done := make(chan error, 1)
	go func() {
		done <- e.sink.ApplyRows(id, rows(18, tx(pgcodec.Update, col("id", "1"), col("v", "a4"), null("big"))))
	}()
	select {
	case <-waiting:
	case err := <-done:
		t.Fatalf("ApplyRows beyond QueueRows returned (err %v) while the lane could not commit", err)
	case <-time.After(time.Minute):
		t.Fatal("ApplyRows beyond QueueRows never waited for room")
	}
	// The knob ran under the lane's mu, which only the wait releases: once
	// the test holds it, the call is waiting.
	l := e.sink.laneFor(relT.OID)
	l.mu.Lock()
	queued := l.mu.qrows
	l.mu.Unlock()
	require.Equal(t, 2, queued, "the lane holds QueueRows queued rows, no more")
	select {
	case err := <-done:
		t.Fatalf("ApplyRows beyond QueueRows returned (err %v) while the lane could not commit", err)
	default:
	}
	require.Less(t, e.sink.Durable(id), common.Ts(14), "nothing committed while the table is held")

	require.NoError(t, hold.Rollback(ctx))
	require.NoError(t, <-done, "the waiting call returns once the lane took its queue")
	require.NoError(t, e.sink.Checkpoint(id, 18))
	e.dur.wait(t, id, 18)
	require.Equal(t, []string{`{"id":1,"v":"a4","big":null}`, `{"id":2,"v":"b","big":null}`, `{"id":3,"v":"c","big":null}`},
		e.contents("app.t"), "every row applied, in call order")
}

package pgsink

import (
	"context"
	"strconv"
	"strings"
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

// wide is a row of width bytes of value in column big (the row's size is
// a few bytes more: its key, its other columns' encoding).
func wide(c pgcodec.Change, id string, width int) pgcodec.RowChange {
	return tx(c, col("id", id), col("v", "w"), col("big", strings.Repeat("x", width)))
}

// waitForRoom starts call, which must wait for room in l (the
// enqueueWaits knob: it is waiting once the test holds the lane's mu), and
// returns the channel its error arrives on, checking it has not arrived.
func waitForRoom(t *testing.T, e *sinkEnv, l *lane, call func() error) <-chan error {
	t.Helper()
	waiting := make(chan struct{})
	var once sync.Once
	e.sink.knobs.enqueueWaits = func() { once.Do(func() { close(waiting) }) } // before the call that reads it
	done := make(chan error, 1)
	go func() { done <- call() }()
	select {
	case <-waiting:
	case err := <-done:
		t.Fatalf("the call returned (err %v) while the lane held its share of QueueBytes", err)
	case <-time.After(time.Minute):
		t.Fatal("the call never waited for room")
	}
	l.mu.Lock() // the knob ran under mu, which only the wait releases
	l.mu.Unlock()
	select {
	case err := <-done:
		t.Fatalf("the call returned (err %v) while the lane held its share of QueueBytes", err)
	default:
	}
	return done
}

// heldBytes is what lane l counts against its share of QueueBytes.
func heldBytes(l *lane) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.mu.qbytes + l.mu.hbytes
}

// A lane holds at most its share of QueueBytes in rows queued and taken
// but not committed, however few they are: with a lane of 64 KiB (one
// lane, QueueRows far away) and its commit blocked (the table locked), two
// rows of 17 kB are taken and due at once (half the share), a third is
// queued, and a fourth would take the lane beyond 64 KiB: ApplyRows waits
// for room, and returns once the table is released and the commit frees
// the bytes; every row is applied in order. Without the byte bound the
// fourth call would return at once (four rows are far from QueueRows), and
// rows of a MB would let a lane hold QueueRows of them: 20 GB.
func TestApplyRowsWaitsWhileTheLaneHoldsQueueBytes(t *testing.T) {
	const share = 64 << 10
	e := newSinkEnv(t, func(o *Options) {
		o.Workers, o.BatchRows, o.QueueRows, o.QueueBytes = 1, 1000, 10000, share
	})
	ctx := context.Background()
	id := common.DispatcherIDFromUint64(1)
	e.firstRow(id)
	e.dur.wait(t, id, 12)
	waitWarmedUp(t, e, 1)
	l := e.sink.laneFor(relT.OID)

	hold := holdTable(t, e, "app.t")
	// Two wide rows, more than half the share: due at once, their commit
	// waits for the table.
	require.NoError(t, e.sink.ApplyRows(id, rows(14, wide(pgcodec.Insert, "2", 17000), wide(pgcodec.Insert, "3", 17000))))
	require.NoError(t, e.sink.Checkpoint(id, 14))
	waitCommitBlockedOn(t, e, "app.t")
	// The commit holds its rows' bytes: a third row still fits.
	require.NoError(t, e.sink.ApplyRows(id, rows(16, wide(pgcodec.Insert, "4", 17000))))
	require.NoError(t, e.sink.Checkpoint(id, 16))
	held := heldBytes(l)
	require.Greater(t, held, int64(3*17000), "the rows committing and the row queued count")
	require.LessOrEqual(t, held, int64(share))

	// A fourth is beyond the share: the call waits.
	done := waitForRoom(t, e, l, func() error {
		return e.sink.ApplyRows(id, rows(18, wide(pgcodec.Insert, "5", 17000)))
	})
	require.Equal(t, held, heldBytes(l), "nothing queued beyond the share")
	require.Less(t, e.sink.Durable(id), common.Ts(14), "nothing committed while the table is held")

	require.NoError(t, hold.Rollback(ctx))
	require.NoError(t, <-done, "the waiting call returns once the commit freed the bytes")
	require.NoError(t, e.sink.Checkpoint(id, 18))
	e.dur.wait(t, id, 18)
	require.Len(t, e.contents("app.t"), 5, "every row applied")
	require.Zero(t, heldBytes(l), "a lane with everything committed holds nothing")
}

// A call larger than a lane's whole share of QueueBytes goes in alone, and
// never waits for room only its own commit could free: into a lane that
// holds nothing it passes at once (and is due at once); a second one
// waits for the first's commit, not for its own, and passes once it is
// committed; a third, after a small row held below the share's half,
// passes once the flush interval commits that row. Every row is applied.
func TestACallLargerThanTheLaneShareGoesInAlone(t *testing.T) {
	const share = 64 << 10
	e := newSinkEnv(t, func(o *Options) {
		o.Workers, o.BatchRows, o.QueueRows, o.QueueBytes = 1, 1000, 10000, share
	})
	ctx := context.Background()
	id := common.DispatcherIDFromUint64(1)
	e.firstRow(id)
	e.dur.wait(t, id, 12)
	waitWarmedUp(t, e, 1)
	l := e.sink.laneFor(relT.OID)
	huge := func(ts common.Ts, first int) []common.Row {
		var cs []pgcodec.RowChange
		for i := range 5 {
			cs = append(cs, wide(pgcodec.Insert, strconv.Itoa(first+i), 20000)) // 100 kB in all
		}
		return rows(ts, cs...)
	}

	hold := holdTable(t, e, "app.t")
	require.NoError(t, e.sink.ApplyRows(id, huge(14, 100)), "an empty lane takes a call of any size")
	require.NoError(t, e.sink.Checkpoint(id, 14))
	waitCommitBlockedOn(t, e, "app.t")
	require.Greater(t, heldBytes(l), int64(share), "the call alone is beyond the share")

	done := waitForRoom(t, e, l, func() error { return e.sink.ApplyRows(id, huge(16, 200)) })
	require.NoError(t, hold.Rollback(ctx))
	require.NoError(t, <-done, "the second passes once the first is committed")
	require.NoError(t, e.sink.Checkpoint(id, 16))
	e.dur.wait(t, id, 16)

	// A small row, held below half the share until the flush interval,
	// then a call beyond the share: it waits for that row's commit, which
	// falls due without it.
	e.sink.knobs.enqueueWaits = nil
	require.NoError(t, e.sink.ApplyRows(id, rows(18, wide(pgcodec.Insert, "300", 10))))
	require.NoError(t, e.sink.ApplyRows(id, huge(20, 400)))
	require.NoError(t, e.sink.Checkpoint(id, 20))
	e.dur.wait(t, id, 20)
	require.Len(t, e.contents("app.t"), 1+5+5+1+5, "every row applied")
}

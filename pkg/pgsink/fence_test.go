package pgsink

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// waitServer polls the target (another process's state) until query
// counts at least one row, with a deadline.
func waitServer(t *testing.T, conn *pgx.Conn, what, query string) {
	t.Helper()
	testwait.For(t, what, func() bool {
		var n int
		require.NoError(t, conn.QueryRow(context.Background(), query).Scan(&n))
		return n > 0
	})
}

// A sink that starts while an earlier sink of the same owner has a
// transaction on its way to commit (a process killed after sending its
// pipeline leaves one behind) waits for it, and every transaction the
// earlier sink tries afterwards fails its fence: it writes nothing more,
// accepts and drops its calls, and its state writes and resets fail with
// ErrSuperseded. Without the fence the later sink would start at once
// and the earlier one's rows would land after it.
func TestALaterSinkWaitsForAndFencesOutAnEarlierOne(t *testing.T) {
	ctx := context.Background()
	a := newSinkEnv(t, func(o *Options) { o.Workers = 1; o.Owner = "feed" })
	require.Equal(t, int64(1), a.sink.Generation())
	id := common.DispatcherIDFromUint64(1)
	a.firstRow(id)
	a.dur.wait(t, id, 12)
	// The lane warms the table once idle (warm.go), in a pipeline behind
	// the fence too: the lock wait the test looks for below must be A's
	// commit, not that warm-up, which B would wait for instead.
	testwait.Within(t, time.Minute, "A's warm-up of the table is over", func() bool {
		return testutil.ToFloat64(a.sink.met.warmed)+testutil.ToFloat64(a.sink.met.warmFailures) == 1
	})

	// The test holds the table: A's next transaction passes its fence,
	// then waits for the table.
	hold, err := a.conn.Begin(ctx)
	require.NoError(t, err)
	_, err = hold.Exec(ctx, "LOCK TABLE app.t IN SHARE MODE")
	require.NoError(t, err)
	watch, err := pgx.Connect(ctx, a.pg.DSN)
	require.NoError(t, err)
	defer watch.Close(context.Background())
	require.NoError(t, a.sink.ApplyRows(id, rows(14, tx(pgcodec.Update, col("id", "1"), col("v", "a2"), null("big")))))
	require.NoError(t, a.sink.Checkpoint(id, 14))
	waitServer(t, watch, "A's transaction waiting for the table",
		"SELECT count(*) FROM pg_locks WHERE locktype = 'relation' AND NOT granted")

	// B, of the same owner, starts: it waits for A's transaction.
	b, err := New(Options{DSN: a.pg.DSN, Workers: 1, Owner: "feed", FlushInterval: 5 * time.Millisecond})
	require.NoError(t, err)
	bDur := newDurables()
	b.SetDurable(bDur.record)
	t.Cleanup(b.Close)
	started := make(chan error, 1)
	go func() { started <- b.Start(ctx) }()
	waitServer(t, watch, "B waiting for the owner's fence",
		"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
	select {
	case err := <-started:
		t.Fatalf("B started while A's transaction was open (err %v)", err)
	default:
	}
	require.NoError(t, hold.Commit(ctx))
	require.NoError(t, <-started)
	require.Equal(t, int64(2), b.Generation())
	a.dur.wait(t, id, 14) // A's transaction committed, before B started
	require.Equal(t, []string{`{"id":1,"v":"a2","big":null}`}, a.contents("app.t"))

	// A is fenced out.
	require.NoError(t, a.sink.ApplyRows(id, rows(16, tx(pgcodec.Insert, col("id", "2"), col("v", "late"), null("big")))))
	require.NoError(t, a.sink.Checkpoint(id, 16))
	select {
	case <-a.sink.Superseded():
	case <-time.After(time.Minute):
		t.Fatal("A never found out it was superseded")
	}
	require.ErrorIs(t, a.sink.Err(), ErrSuperseded)
	require.NoError(t, a.sink.ApplyRows(id, rows(18, tx(pgcodec.Insert, col("id", "3"), col("v", "late"), null("big")))),
		"a superseded sink accepts and drops")
	require.ErrorIs(t, a.sink.SetState(ctx, "k", "v"), ErrSuperseded)
	require.ErrorIs(t, a.sink.Reset(ctx, []pgcodec.Relation{relT}), ErrSuperseded)
	require.Equal(t, common.Ts(14), a.sink.Durable(id))
	_, found, err := b.State(ctx, "k")
	require.NoError(t, err)
	require.False(t, found, "A's state write did not land")

	// B writes.
	require.NoError(t, b.Bind(ctx, id, relT, 14))
	require.NoError(t, b.BeginEpoch(id, 1, 14))
	require.NoError(t, b.ApplyRows(id, rows(16, tx(pgcodec.Insert, col("id", "2"), col("v", "b"), null("big")))))
	require.NoError(t, b.Checkpoint(id, 16))
	bDur.wait(t, id, 16)
	require.NoError(t, b.Err())
	require.Equal(t, []string{`{"id":1,"v":"a2","big":null}`, `{"id":2,"v":"b","big":null}`}, a.contents("app.t"),
		"only B's rows after B started")
}

// Reset empties, in one transaction, the tables it is given and the
// ones the checkpoints name (a table bound before and no longer
// published), and forgets the checkpoints and the state; a checkpoint
// naming no relation, or one that is not valid SQL, becomes no SQL.
func TestResetEmptiesWhatTheChangefeedWrote(t *testing.T) {
	ctx := context.Background()
	e := newSinkEnv(t, nil)
	relU := pgcodec.Relation{OID: 200, Schema: "app", Name: "u", Columns: relT.Columns[:2]}
	idT, idU := common.DispatcherIDFromUint64(1), common.DispatcherIDFromUint64(2)
	require.NoError(t, e.sink.BindAll(ctx, []Binding{{ID: idT, Rel: relT, StartTs: 10}, {ID: idU, Rel: relU, StartTs: 10}}))
	for _, id := range []common.DispatcherID{idT, idU} {
		require.NoError(t, e.sink.BeginEpoch(id, 1, 10))
		require.NoError(t, e.sink.ApplyRows(id, rows(12, tx(pgcodec.Insert, col("id", "1"), col("v", "a")))))
		require.NoError(t, e.sink.Checkpoint(id, 12))
		e.dur.wait(t, id, 12)
	}
	require.NoError(t, e.sink.SetState(ctx, "snapshot-done:x", "1"))
	_, err := e.conn.Exec(ctx, `INSERT INTO cdcflow.checkpoints (dispatcher, table_oid, target, ts) VALUES
  ('hostile', 1, 'app.t; DROP TABLE app.u', 1), ('gone', 2, 'app.nothing', 1), ('own', 3, '"cdcflow"."owners"', 1)`)
	require.NoError(t, err)

	require.NoError(t, e.sink.Reset(ctx, []pgcodec.Relation{relT}))
	require.Empty(t, e.contents("app.t"))
	require.Empty(t, e.contents("app.u"), "named by its checkpoint only")
	ckpts, err := e.sink.Checkpoints(ctx)
	require.NoError(t, err)
	require.Empty(t, ckpts)
	_, found, err := e.sink.State(ctx, "snapshot-done:x")
	require.NoError(t, err)
	require.False(t, found)
	var owners int
	require.NoError(t, e.conn.QueryRow(ctx, "SELECT count(*) FROM cdcflow.owners").Scan(&owners))
	require.Equal(t, 1, owners, "a checkpoint naming the sink's own tables empties none of them")
}

// The owner's wrote marker is set by a sink's first transaction that
// writes the target's tables, not by a Start (which raises the generation
// whether or not anything follows) nor by checkpoints alone, and a Reset
// clears it: Wrote is what serve asks before emptying a target for a new
// slot, and a start that failed after its sink started wrote nothing.
func TestWroteMarksAnOwnerThatWroteTables(t *testing.T) {
	ctx := context.Background()
	e := newSinkEnv(t, func(o *Options) { o.Owner = "feed" })
	require.False(t, e.sink.Wrote(), "a new owner")
	next := func() *Sink {
		s, err := New(Options{DSN: e.pg.DSN, Workers: 1, Owner: "feed", FlushInterval: 5 * time.Millisecond, MaxFlushInterval: DefaultFlushInterval})
		require.NoError(t, err)
		t.Cleanup(s.Close)
		require.NoError(t, s.Start(ctx))
		return s
	}
	s := next()
	require.False(t, s.Wrote(), "an earlier sink that only started")

	id := common.DispatcherIDFromUint64(1)
	dur := newDurables()
	s.SetDurable(dur.record)
	require.NoError(t, s.Bind(ctx, id, relT, 10))
	require.NoError(t, s.BeginEpoch(id, 1, 10))
	require.NoError(t, s.Checkpoint(id, 11))
	dur.wait(t, id, 11)
	s = next()
	require.False(t, s.Wrote(), "an earlier sink that wrote checkpoints only")

	dur = newDurables()
	s.SetDurable(dur.record)
	require.NoError(t, s.Bind(ctx, id, relT, 11))
	require.NoError(t, s.BeginEpoch(id, 1, 11))
	require.NoError(t, s.ApplyRows(id, rows(12, tx(pgcodec.Insert, col("id", "1"), col("v", "a")))))
	require.NoError(t, s.Checkpoint(id, 12))
	dur.wait(t, id, 12)
	s = next()
	require.True(t, s.Wrote(), "an earlier sink that wrote rows")
	require.True(t, next().Wrote(), "and the one after it, which wrote nothing")

	s = next()
	require.NoError(t, s.Reset(ctx, []pgcodec.Relation{relT}))
	require.False(t, next().Wrote(), "after a Reset")

	// A target a sink wrote to before cdcflow.owners existed: checkpoints,
	// and no owner's row.
	_, err := e.conn.Exec(ctx, `DELETE FROM cdcflow.owners;
INSERT INTO cdcflow.checkpoints (dispatcher, table_oid, target, ts) VALUES ('old', 100, 'app.t', 1)`)
	require.NoError(t, err)
	require.True(t, next().Wrote(), "a new owner on a target with checkpoints")
}

// A sink that was never started has no generation to pass the fence
// with: its fenced calls fail with ErrNotStarted and it does not count
// itself superseded.
func TestFencedCallsBeforeStartFail(t *testing.T) {
	s, err := New(Options{DSN: "postgres://127.0.0.1:1/x"})
	require.NoError(t, err)
	defer s.Close()
	ctx := context.Background()
	require.ErrorIs(t, s.SetState(ctx, "k", "v"), ErrNotStarted)
	require.ErrorIs(t, s.CheckFence(ctx), ErrNotStarted)
	require.ErrorIs(t, s.Reset(ctx, nil), ErrNotStarted)
	require.ErrorIs(t, s.ClearProgress(ctx), ErrNotStarted)
	require.NoError(t, s.Err())
}

// Owner is bounded before it reaches the target.
func TestOwnerIsValidated(t *testing.T) {
	for _, owner := range []string{string(make([]byte, 64)), "a\x00b", "\xff"} {
		_, err := New(Options{DSN: "postgres://x", Owner: owner})
		require.ErrorIs(t, err, ErrInvalidOptions, "%q", owner)
	}
	_, err := New(Options{DSN: "postgres://x", Owner: "cdcflow_feed-1"})
	require.NoError(t, err)
}

// The fence holds on a target whose default isolation is REPEATABLE READ:
// there a transaction's snapshot is taken at its first statement, before
// the fence's lock wait, and the fence would read the generation as it
// was before a later sink's Start committed, and pass. The sink's
// connections ask for READ COMMITTED. The test stands in for the later
// Start: it holds the owner's lock exclusively while A's transaction
// waits in its fence, then raises the generation and commits.
func TestTheFenceHoldsUnderRepeatableRead(t *testing.T) {
	ctx := context.Background()
	e := newSinkEnv(t, nil)
	var db string
	require.NoError(t, e.conn.QueryRow(ctx, "SELECT current_database()").Scan(&db))
	_, err := e.conn.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{db}.Sanitize()+" SET default_transaction_isolation = 'repeatable read'")
	require.NoError(t, err)
	a, err := New(Options{DSN: e.pg.DSN, Workers: 1, Owner: "feed", FlushInterval: 5 * time.Millisecond, MaxFlushInterval: DefaultFlushInterval})
	require.NoError(t, err)
	t.Cleanup(a.Close)
	require.NoError(t, a.Start(ctx))
	id := common.DispatcherIDFromUint64(1)
	require.NoError(t, a.Bind(ctx, id, relT, 10))
	require.NoError(t, a.BeginEpoch(id, 1, 10))
	dur := newDurables()
	a.SetDurable(dur.record)
	// A first write sets the owner's wrote marker: the next transaction is
	// then the fence and the rows only (an update of the owner's row
	// would fail under REPEATABLE READ for its own reason).
	require.NoError(t, a.ApplyRows(id, rows(11, tx(pgcodec.Insert, col("id", "0"), col("v", "first")))))
	require.NoError(t, a.Checkpoint(id, 11))
	dur.wait(t, id, 11)

	hold, err := e.conn.Begin(ctx)
	require.NoError(t, err)
	defer hold.Rollback(context.Background()) //nolint:errcheck // after Commit it is a no-op
	_, err = hold.Exec(ctx, "SELECT pg_advisory_xact_lock($1, hashtext('feed'))", fenceLockClass)
	require.NoError(t, err)
	require.NoError(t, a.ApplyRows(id, rows(12, tx(pgcodec.Insert, col("id", "1"), col("v", "late")))))
	require.NoError(t, a.Checkpoint(id, 12))
	watch, err := pgx.Connect(ctx, e.pg.DSN)
	require.NoError(t, err)
	defer watch.Close(context.Background())
	waitServer(t, watch, "A's fence waiting for the owner's lock",
		"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
	_, err = hold.Exec(ctx, "UPDATE cdcflow.owners SET generation = generation + 1 WHERE owner = 'feed'")
	require.NoError(t, err)
	require.NoError(t, hold.Commit(ctx))

	select {
	case <-a.Superseded():
	case <-time.After(time.Minute):
		t.Fatal("A's transaction passed the fence of a generation no longer the owner's")
	}
	require.Equal(t, []string{`{"id":0,"v":"first","big":null}`}, e.contents("app.t"))
}

// With SoleOwner, Start refuses a target that another owner's sink
// started on, before it writes its own owner's row there.
func TestASoleOwnerRefusesATargetOfAnotherOwner(t *testing.T) {
	e := newSinkEnv(t, nil) // owner "default"
	s, err := New(Options{DSN: e.pg.DSN, Owner: "feed", SoleOwner: true})
	require.NoError(t, err)
	defer s.Close()
	require.ErrorIs(t, s.Start(context.Background()), ErrAnotherOwner)
	rows, err := e.conn.Query(context.Background(), "SELECT owner FROM cdcflow.owners")
	require.NoError(t, err)
	owners, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"default"}, owners)
}

// A lane takes the connection for lost on the server's connection and
// shutdown errors, but not on a protocol violation, which the server
// reports of a Bind that does not match its statement: sent again it
// would fail again, so it is the table's to fail.
func TestWhatALaneTakesForALostConnection(t *testing.T) {
	lost := func(err error) bool { return classify(false, err) == failLost }
	for code, want := range map[string]bool{"08006": true, "57P01": true, "08P01": false, "23505": false, "42703": false} {
		require.Equal(t, want, lost(&pgconn.PgError{Code: code}), code)
	}
	require.True(t, lost(io.ErrUnexpectedEOF), "no server error: the connection broke")
	require.False(t, lost(fmt.Errorf("%w: x", ErrSchemaChange)))
}

// Close does not wait for a Start that waits on the owner's fence (an
// earlier sink's transaction still open, for up to FenceWait): it returns
// at once, and Start returns ErrClosed, its wait in the target cancelled.
// Start used to hold the sink's lock across that wait, and Close takes it.
func TestCloseDuringStartsFenceWaitReturnsPromptly(t *testing.T) {
	e := newSinkEnv(t, nil) // the cdcflow schema is there
	ctx := context.Background()
	// The test stands in for an earlier sink's open transaction: it holds
	// the owner's lock.
	hold, err := e.conn.Begin(ctx)
	require.NoError(t, err)
	defer hold.Rollback(context.Background()) //nolint:errcheck // after Rollback a no-op
	_, err = hold.Exec(ctx, "SELECT pg_advisory_xact_lock($1, hashtext('feed'))", fenceLockClass)
	require.NoError(t, err)

	s, err := New(Options{DSN: e.pg.DSN, Workers: 1, Owner: "feed", FenceWait: time.Hour})
	require.NoError(t, err)
	started := make(chan error, 1)
	go func() { started <- s.Start(ctx) }()
	watch, err := pgx.Connect(ctx, e.pg.DSN)
	require.NoError(t, err)
	defer watch.Close(context.Background())
	waitServer(t, watch, "Start waiting for the owner's fence",
		"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")

	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second): // FenceWait is an hour
		t.Fatal("Close waited for Start's wait on the fence")
	}
	select {
	case err := <-started:
		require.ErrorIs(t, err, ErrClosed)
	case <-time.After(30 * time.Second):
		t.Fatal("Start went on waiting on the fence after Close")
	}
	require.ErrorIs(t, s.Start(ctx), ErrClosed, "and a closed sink does not start")
	waitServer(t, watch, "Start's wait ended in the target",
		"SELECT 1 - count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
}

// A transaction of an earlier sink that holds the owner's fence and never
// ends (its process frozen inside it, a SIGSTOP or a VM pause) holds a
// later sink's Start for FenceWait: then Start fails (ErrConnect), or,
// with EndFenceHolders, ends that backend and starts, its generation
// above; the held transaction's write never commits.
func TestAFenceHeldByAFrozenTransactionIsEndedAfterFenceWait(t *testing.T) {
	ctx := context.Background()
	a := newSinkEnv(t, func(o *Options) { o.Workers = 1; o.Owner = "feed" })
	id := common.DispatcherIDFromUint64(1)
	a.firstRow(id)
	a.dur.wait(t, id, 12)
	// The frozen transaction: it passed A's fence and wrote, and its
	// client sends nothing more.
	frozen, err := pgx.Connect(ctx, a.pg.DSN)
	require.NoError(t, err)
	defer frozen.Close(context.Background())
	tx, err := frozen.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, fenceSQL, "feed", a.sink.Generation())
	require.NoError(t, err)
	_, err = tx.Exec(ctx, "UPDATE app.t SET v = 'frozen' WHERE id = 1")
	require.NoError(t, err)

	start := func(end bool) (*Sink, error) {
		s, err := New(Options{DSN: a.pg.DSN, Workers: 1, Owner: "feed", FenceWait: 300 * time.Millisecond, EndFenceHolders: end})
		require.NoError(t, err)
		t.Cleanup(s.Close)
		s.SetDurable(newDurables().record)
		return s, s.Start(ctx)
	}
	_, err = start(false)
	require.ErrorIs(t, err, ErrConnect, "without EndFenceHolders")
	b, err := start(true)
	require.NoError(t, err, "with EndFenceHolders")
	require.Greater(t, b.Generation(), a.sink.Generation())
	require.Error(t, tx.Commit(ctx), "the frozen transaction was ended")
	require.Equal(t, []string{`{"id":1,"v":"a","big":null}`}, a.contents("app.t"), "its write never committed")
}

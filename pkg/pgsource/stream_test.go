package pgsource

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// openAndSubscribe opens src, subscribes every table given from the
// snapshot, and starts it.
func openAndSubscribe(t *testing.T, e *srcEnv, src *Source, tables ...string) (Info, map[string]*recordingSink) {
	t.Helper()
	info, err := src.Open(context.Background())
	require.NoError(t, err)
	sinks := map[string]*recordingSink{}
	for _, name := range tables {
		sinks[name] = newRecordingSink(t, info.ResumeTs-1)
		sub, err := src.Subscribe(common.TableSpan(int64(e.oid(name))), info.ResumeTs-1, sinks[name])
		require.NoError(t, err)
		t.Cleanup(sub.Close)
	}
	require.NoError(t, src.Start())
	return info, sinks
}

// An update that leaves a TOASTed column alone carries it as unchanged,
// never as null: the sink must keep the old value.
func TestUnchangedToastIsMarkedUnchanged(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE docs (id int PRIMARY KEY, n int, body text)")
	e.exec("ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL") // stored out of line, uncompressed
	e.exec("INSERT INTO docs VALUES (1, 0, repeat('x', 100000))")
	_, sinks := openAndSubscribe(t, e, e.source(nil), "docs")
	sink := sinks["docs"]
	sink.waitFor("the snapshot", func() bool { return len(sink.rows) == 1 })
	e.exec("UPDATE docs SET n = 1 WHERE id = 1")
	sink.waitFor("the update", func() bool { return len(sink.rows) == 2 })
	c := sink.changes()[1]
	require.Equal(t, pgcodec.Update, c.Change)
	require.Equal(t, "1", text(c, "n"))
	require.Equal(t, "<unchanged>", text(c, "body"))
}

// An update that changes the key and leaves a TOASTed column alone is a
// move from the old key: the new row's unchanged value is in the old row
// only, which a delete and an insert would have lost. Without an
// unchanged column it stays a delete and an insert.
func TestAKeyChangeWithAnUnchangedToastIsAMove(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE docs (a int, b text, n int, body text, PRIMARY KEY (a, b))")
	e.exec("ALTER TABLE docs ALTER COLUMN body SET STORAGE EXTERNAL")
	e.exec("INSERT INTO docs VALUES (1, 'x', 0, repeat('x', 100000))")
	_, sinks := openAndSubscribe(t, e, e.source(nil), "docs")
	sink := sinks["docs"]
	sink.waitFor("the snapshot", func() bool { return len(sink.rows) == 1 })
	e.exec("UPDATE docs SET a = 2, n = 1 WHERE a = 1")
	e.exec("UPDATE docs SET a = 3, body = 'short' WHERE a = 2")
	sink.waitFor("the updates", func() bool { return len(sink.rows) == 4 })
	cs := sink.changes()
	require.Equal(t, pgcodec.Move, cs[1].Change)
	require.Equal(t, "2", text(cs[1], "a"))
	require.Equal(t, "<unchanged>", text(cs[1], "body"))
	require.Equal(t, []pgcodec.Datum{{Name: "a", Kind: pgcodec.Text, Text: []byte("1")}, {Name: "b", Kind: pgcodec.Text, Text: []byte("x")}},
		cs[1].From, "the old key, in key order")
	require.Equal(t, []pgcodec.Change{pgcodec.Delete, pgcodec.Insert}, []pgcodec.Change{cs[2].Change, cs[3].Change},
		"a key change with every value given")
}

// A transaction larger than ChunkRows reaches the store in chunks before
// its commit's resolved-ts: it is never held whole.
func TestLargeTransactionIsSpilledInChunks(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE big (id int PRIMARY KEY, v text)")
	_, sinks := openAndSubscribe(t, e, e.source(func(o *testOptions) { o.ChunkRows = 100 }), "big")
	sink := sinks["big"]
	e.exec("INSERT INTO big SELECT g, 'v' FROM generate_series(1, 5000) g")
	sink.waitFor("every row", func() bool { return len(sink.rows) == 5000 })
	sink.mu.Lock()
	defer sink.mu.Unlock()
	require.GreaterOrEqual(t, sink.batches, 50, "pushed in chunks of 100")
	for i, r := range sink.rows {
		idx, err := pgcodec.ChangeIndex(r.Key)
		require.NoError(t, err)
		require.Equal(t, uint32(i+1), idx, "in WAL order")
	}
}

// A transaction of wide rows is pushed in chunks of chunkBytes, not held to
// ChunkRows: each push holds less than chunkBytes and one row.
func TestWideRowsAreSpilledInChunksOfBytes(t *testing.T) {
	c := testCore(map[uint32]pgcodec.Relation{7: {OID: 7, Schema: "public", Name: "t", Columns: []pgcodec.Column{
		{Name: "id", Type: "text", Key: true}, {Name: "v", Type: "text"}}}})
	c.chunkBytes = 4 << 10
	wide := bytes.Repeat([]byte("v"), 1000)
	const n = 40
	for i := range n {
		require.NoError(t, c.change(7, pgcodec.Insert, nil, 0, []tupleCol{{kind: 't', data: fmt.Appendf(nil, "k%d", i)}, {kind: 't', data: wide}}))
	}
	var pushes, rows int
	for _, a := range c.take() {
		if a.kind != actPush {
			continue
		}
		pushes++
		size, most := 0, 0
		for i := range a.batch.Rows {
			size += a.batch.Rows[i].Size()
			most = max(most, a.batch.Rows[i].Size())
		}
		require.Less(t, size, c.chunkBytes+most, "push %d", pushes)
		rows += len(a.batch.Rows)
	}
	require.GreaterOrEqual(t, pushes, 9, "40 rows of 1 kB in chunks of 4 kB")
	require.Equal(t, n-len(c.cur.pending[7]), rows, "every row pushed but the last chunk's")
}

// A subscription from a start-ts the stream has passed is served by
// reading the slot again: it gets every change above its start-ts, with
// the same commit-ts the first reading gave, and the subscription that
// already had them gets none twice. After a restart (a new Source on the
// same slot and positions) the commit-ts of new commits continue the
// chain and a subscription from its checkpoint resumes exactly there.
func TestReplayAndRestartReadTheSameCommitTs(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t1 (id int PRIMARY KEY)")
	var mu sync.Mutex
	var safe common.Ts
	safePoint := func(o *testOptions) {
		o.SafePoint = func() (common.Ts, bool) {
			mu.Lock()
			defer mu.Unlock()
			return safe, safe != 0
		}
	}
	src := e.source(safePoint)
	info, sinks := openAndSubscribe(t, e, src, "t1")
	first := sinks["t1"]
	for i := 1; i <= 3; i++ {
		e.exec("INSERT INTO t1 VALUES ($1)", i)
	}
	first.waitFor("three rows", func() bool { return len(first.rows) == 3 })

	// A late subscription from the snapshot's commit-ts: replayed.
	late := newRecordingSink(t, info.SnapshotTs)
	sub, err := src.Subscribe(common.TableSpan(int64(e.oid("t1"))), info.SnapshotTs, late)
	require.NoError(t, err)
	late.waitFor("the replay", func() bool { return len(late.rows) == 3 })
	e.exec("INSERT INTO t1 VALUES (4)")
	first.waitFor("the fourth", func() bool { return len(first.rows) == 4 })
	late.waitFor("the fourth", func() bool { return len(late.rows) == 4 })
	first.mu.Lock()
	late.mu.Lock()
	for i := range 4 {
		require.Equal(t, first.rows[i].CommitTs, late.rows[i].CommitTs, "row %d: the same commit-ts on both readings", i)
		require.Equal(t, first.rows[i].Key, late.rows[i].Key)
	}
	require.Len(t, first.rows, 4, "none twice on the first")
	late.mu.Unlock()
	first.mu.Unlock()
	sub.Close()

	// The safe point at the second row: the slot moves there.
	first.mu.Lock()
	checkpoint := first.rows[1].CommitTs
	want := []common.Row{first.rows[2], first.rows[3]}
	first.mu.Unlock()
	start := src.Position()
	mu.Lock()
	safe = checkpoint
	mu.Unlock()
	testwait.Within(t, 60*time.Second, "the slot confirmed to the checkpoint's position", func() bool { p := src.Position(); return p.LSN > start.LSN && p.Ts == checkpoint })
	src.Close()

	again := e.source(nil)
	info2, err := again.Open(context.Background())
	require.NoError(t, err)
	require.False(t, info2.Created)
	require.Equal(t, checkpoint, info2.ResumeTs)
	resumed := newRecordingSink(t, checkpoint)
	sub2, err := again.Subscribe(common.TableSpan(int64(e.oid("t1"))), checkpoint, resumed)
	require.NoError(t, err)
	defer sub2.Close()
	other, err := again.Subscribe(common.TableSpan(int64(e.oid("t1"))), info2.ResumeTs, newRecordingSink(t, info2.ResumeTs))
	require.NoError(t, err, "a subscription at the resume point is served")
	defer other.Close()
	require.NoError(t, again.Start())
	resumed.waitFor("the rows after the checkpoint", func() bool { return len(resumed.rows) == 2 })
	resumed.mu.Lock()
	defer resumed.mu.Unlock()
	for i := range want {
		require.Equal(t, want[i].CommitTs, resumed.rows[i].CommitTs, "row %d after the restart: the same commit-ts", i)
		require.Equal(t, want[i].Key, resumed.rows[i].Key)
	}
	resumed.mu.Unlock()
	e.exec("INSERT INTO t1 VALUES (5)")
	resumed.waitFor("a new row", func() bool { return len(resumed.rows) == 3 })
	resumed.mu.Lock()
	require.Greater(t, resumed.rows[2].CommitTs, want[1].CommitTs)
	_, err = again.Subscribe(common.TableSpan(int64(e.oid("t1"))), info.SnapshotTs, newRecordingSink(t, 0))
	require.ErrorIs(t, err, ErrStartTsTruncated, "below what the slot retains")
}

// A table created (and so published, FOR ALL TABLES) while streaming is
// announced with its first change's commit-ts; the slot waits for it, and
// a subscription from just below that gets it from its first row.
func TestTableAddedWhileStreaming(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t1 (id int PRIMARY KEY)")
	e.exec("CREATE PUBLICATION cdcflow FOR ALL TABLES") // the user's: a new table is in it at once
	announced := make(chan announcement, 4)
	src := e.source(func(o *testOptions) {
		o.OnNewTable = announceInto(announced)
		o.SafePoint = func() (common.Ts, bool) { return common.TsFromTime(time.Now().Add(time.Hour)), true }
	})
	_, sinks := openAndSubscribe(t, e, src, "t1")
	e.exec("INSERT INTO t1 VALUES (1)")
	sinks["t1"].waitFor("a row", func() bool { return len(sinks["t1"].rows) == 1 })
	e.exec("CREATE TABLE t2 (id int PRIMARY KEY, v text)")
	e.exec("INSERT INTO t2 VALUES (1, 'a'), (2, 'b')")
	e.exec("INSERT INTO t2 VALUES (3, 'c')")
	a := nextAnnouncement(t, announced, "t2")
	require.Equal(t, []string{"id"}, a.rel.KeyColumns())
	require.Less(t, src.Position().Ts, a.ts, "the slot is held before t2's first change")
	sink := newRecordingSink(t, a.ts-1)
	sub, err := src.Subscribe(common.TableSpan(int64(a.rel.OID)), a.ts-1, sink)
	require.NoError(t, err)
	defer sub.Close()
	sink.waitFor("t2 from its first row", func() bool { return len(sink.rows) == 3 })
	require.Equal(t, a.ts, sink.rows[0].CommitTs)
}

// A table created without a key while streaming is announced at its
// first change like any new table (it was skipped, logged and counted,
// until it got a key), with the identity that says how its rows are
// found; subscribed from there it gets its rows, before and after it gets
// a key.
func TestAKeylessTableCreatedWhileStreamingIsAnnounced(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t1 (id int PRIMARY KEY)")
	e.exec("CREATE PUBLICATION cdcflow FOR ALL TABLES") // the user's: a new table is in it at once
	type joined struct {
		rel pgcodec.Relation
		ts  common.Ts
	}
	announced := make(chan joined, 4)
	src := e.source(func(o *testOptions) {
		o.OnNewTable = func(rel pgcodec.Relation, ts common.Ts) { announced <- joined{rel, ts} }
		o.SafePoint = func() (common.Ts, bool) { return common.TsFromTime(time.Now().Add(time.Hour)), true }
	})
	openAndSubscribe(t, e, src, "t1")
	e.exec("CREATE TABLE late (a int, b text)")
	e.exec("INSERT INTO late VALUES (1, 'before its key')")
	var j joined
	select {
	case j = <-announced:
	case <-time.After(60 * time.Second):
		t.Fatal("a table without a key was never announced")
	}
	require.Equal(t, "late", j.rel.Name)
	require.Equal(t, pgcodec.IdentityNone, j.rel.Identity)
	require.Zero(t, testutil.ToFloat64(src.met.skippedTables))
	sink := newRecordingSink(t, j.ts-1)
	sub, err := src.Subscribe(common.TableSpan(int64(e.oid("late"))), j.ts-1, sink)
	require.NoError(t, err)
	defer sub.Close()
	e.exec("ALTER TABLE late ADD PRIMARY KEY (a)")
	e.exec("INSERT INTO late VALUES (2, 'after')")
	sink.waitFor("its rows", func() bool { return len(sink.rows) == 2 })
	require.Equal(t, "1", text(sink.changes()[0], "a"))
	require.Equal(t, "2", text(sink.changes()[1], "a"))
	require.Empty(t, announced, "announced once")
}

// A new column of a replicated table is a DDL at the commit-ts just below
// the first commit that uses it, with the relation's new columns.
func TestAddColumnIsADDLBeforeItsFirstRow(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t1 (id int PRIMARY KEY)")
	_, sinks := openAndSubscribe(t, e, e.source(nil), "t1")
	sink := sinks["t1"]
	e.exec("INSERT INTO t1 VALUES (1)")
	sink.waitFor("a row", func() bool { return len(sink.rows) == 1 })
	e.exec("ALTER TABLE t1 ADD COLUMN extra varchar(12)")
	e.exec("INSERT INTO t1 VALUES (2, 'x')")
	sink.waitFor("the second row", func() bool { return len(sink.rows) == 2 })
	row := sink.rows[1]
	testwait.Within(t, 60*time.Second, "the schema frontier past the row", func() bool { return e.schema.ResolvedTs() >= row.CommitTs })
	// After the first row's (the session's first description of a table
	// is a DDL too: see core.relation).
	ddls, err := e.schema.FetchDDLs(int64(e.oid("t1")), sink.rows[0].CommitTs, row.CommitTs, nil)
	require.NoError(t, err)
	require.Len(t, ddls, 1)
	require.Equal(t, row.CommitTs-1, ddls[0].CommitTs)
	rel, err := pgcodec.ParseRelationDDL(ddls[0].Query)
	require.NoError(t, err)
	require.Equal(t, []pgcodec.Column{{Name: "id", Type: "integer", TypeOID: 23, Key: true, Num: 1},
		{Name: "extra", Type: "character varying(12)", TypeOID: 1043, Num: 2}}, rel.Columns, "numbered by the DDL capture")
	require.Equal(t, "x", text(sink.changes()[1], "extra"))
}

// The replication connection terminated by the server: the source
// connects again and resumes from the slot, nothing lost or twice.
func TestTerminatedConnectionResumes(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t1 (id int PRIMARY KEY)")
	src := e.source(nil)
	_, sinks := openAndSubscribe(t, e, src, "t1")
	sink := sinks["t1"]
	for i := 1; i <= 10; i++ {
		e.exec("INSERT INTO t1 VALUES ($1)", i)
		if i == 5 {
			sink.waitFor("five rows", func() bool { return len(sink.rows) >= 5 })
			var killed int
			require.NoError(t, e.conn.QueryRow(context.Background(),
				"SELECT count(pg_terminate_backend(active_pid)) FROM pg_replication_slots WHERE active_pid IS NOT NULL").Scan(&killed))
			require.Equal(t, 1, killed, "the walsender was terminated")
		}
	}
	sink.waitFor("ten rows", func() bool { return len(sink.rows) >= 10 })
	testwait.Within(t, 60*time.Second, "a reconnect", func() bool { return testutilValue(src.met.reconnects) >= 1 })
	seen := map[string]bool{}
	for _, c := range sink.changes() {
		id := text(c, "id")
		require.False(t, seen[id], "row %s twice", id)
		seen[id] = true
	}
	require.Len(t, seen, 10)
}

// sinkFunc is a Sink made of a function (the edge under test is the
// session's push context).
type sinkFunc func(ctx context.Context, b eventstore.Batch) error

func (f sinkFunc) Push(ctx context.Context, b eventstore.Batch) error { return f(ctx, b) }

// TestAPushCancelledByACloseLeavesTheNextPushesLive: the session pushes
// with one context; a subscription's Close cancels the push in flight
// through it. When that push still completes, the pushes to the other
// subscriptions that follow must get a live context, not the cancelled one
// (they would fail and restart the stream for nothing).
func TestAPushCancelledByACloseLeavesTheNextPushesLive(t *testing.T) {
	ss := &session{s: &Source{log: zaptest.NewLogger(t)}}
	defer ss.endPushes()
	closed := make(chan struct{})
	var closing *sub
	closing = &sub{oid: 1, guard: eventstore.NewSinkGuard(sinkFunc(func(ctx context.Context, _ eventstore.Batch) error {
		go func() { closing.guard.Close(); close(closed) }()
		<-ctx.Done() // Close cancelled this push; it completes anyway
		return nil
	}))}
	var live []error
	other := &sub{oid: 2, guard: eventstore.NewSinkGuard(sinkFunc(func(ctx context.Context, _ eventstore.Batch) error {
		live = append(live, ctx.Err())
		return nil
	}))}
	ctx := context.Background()
	require.NoError(t, ss.push(ctx, closing, eventstore.Batch{ResolvedTs: 10}))
	<-closed
	require.NoError(t, ss.push(ctx, other, eventstore.Batch{ResolvedTs: 10}))
	require.NoError(t, ss.push(ctx, other, eventstore.Batch{ResolvedTs: 12}))
	require.Equal(t, []error{nil, nil}, live)
}

// Open reads where to resume only from a slot no walsender is attached to
// (one that is may still read its client's last status report and move
// the slot's confirmed flush LSN): without TakeOver it waits, on its
// clock, for the walsender to leave and then fails with ErrSlotInUse;
// with TakeOver it terminates the walsender and goes on.
func TestOpenWaitsForOrTakesOverAnAttachedSlot(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t1 (id int PRIMARY KEY)")
	first := e.source(nil)
	_, sinks := openAndSubscribe(t, e, first, "t1")
	e.exec("INSERT INTO t1 VALUES (1)")
	sinks["t1"].waitFor("a row", func() bool { return len(sinks["t1"].rows) >= 1 })
	var pid int32
	require.NoError(t, e.conn.QueryRow(context.Background(),
		"SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'cdcflow' AND active_pid IS NOT NULL").Scan(&pid))

	fake := clock.NewFake(time.Unix(1_800_000_000, 0))
	waiting := e.source(func(o *testOptions) { o.Clock = fake })
	errc := make(chan error, 1)
	go func() {
		_, err := waiting.Open(context.Background())
		errc <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, fake.WaitWaiters(ctx, 1)) // it polls the slot on its clock
	fake.Advance(slotWait)
	require.ErrorIs(t, <-errc, ErrSlotInUse)

	taker := e.source(func(o *testOptions) { o.TakeOver = true })
	_, err := taker.Open(context.Background())
	require.NoError(t, err)
	var alive bool
	require.NoError(t, e.conn.QueryRow(context.Background(), "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)", pid).Scan(&alive))
	require.False(t, alive, "the walsender that held the slot was terminated")
}

// captureUpstream hands the test the sink the store gives it.
type captureUpstream struct{ sinks chan eventstore.Sink }

func (u captureUpstream) Subscribe(_ common.Span, _ common.Ts, sink eventstore.Sink) (eventstore.Subscription, error) {
	u.sinks <- sink
	return closeFunc(func() {}), nil
}

type closeFunc func()

func (f closeFunc) Close() { f() }

// TestAPushTheStoreRefusesIsCountedAndLoggedAsAnError: a session skips
// what each subscription has, so the real store refusing a push (a row at
// or below the table's resolved-ts, a resolved-ts going back) means stream
// and store disagree and rows may be missing downstream. It must not pass
// as a debug line: it is counted and logged as an error, and the stream
// goes on; a push the store takes counts nothing.
func TestAPushTheStoreRefusesIsCountedAndLoggedAsAnError(t *testing.T) {
	up := captureUpstream{sinks: make(chan eventstore.Sink, 1)}
	store, err := eventstore.Open(eventstore.Options{Upstream: up})
	require.NoError(t, err)
	require.NoError(t, store.Start())
	defer func() { require.NoError(t, store.Close()) }()
	require.NoError(t, store.RegisterDispatcher(common.DispatcherID{Lo: 1}, common.TableSpan(7), 0, eventstore.NotifierFunc(func(common.Ts, common.Ts) {})))
	sink := <-up.sinks

	core, logs := observer.New(zapcore.DebugLevel)
	src := &Source{log: zap.New(core)}
	src.met, err = newMetrics(src, prometheus.NewRegistry())
	require.NoError(t, err)
	ss := &session{s: src}
	defer ss.endPushes()
	b := &sub{oid: 7, guard: eventstore.NewSinkGuard(sink)}
	ctx := context.Background()
	row := func(ts common.Ts) common.Row {
		return common.Row{Op: common.OpPut, Key: []byte("k"), Value: []byte("v"), StartTs: ts - 1, CommitTs: ts}
	}

	require.NoError(t, ss.push(ctx, b, eventstore.Batch{Rows: []common.Row{row(90)}, ResolvedTs: 100}))
	require.Zero(t, testutil.ToFloat64(src.met.refused), "a push the store took")
	require.Zero(t, logs.FilterLevelExact(zapcore.ErrorLevel).Len())

	require.NoError(t, ss.push(ctx, b, eventstore.Batch{Rows: []common.Row{row(50)}}), "the stream goes on")
	require.Equal(t, 1.0, testutil.ToFloat64(src.met.refused), "a row below the resolved-ts")
	require.NoError(t, ss.push(ctx, b, eventstore.Batch{ResolvedTs: 80}))
	require.Equal(t, 2.0, testutil.ToFloat64(src.met.refused), "a resolved-ts going back")
	errs := logs.FilterLevelExact(zapcore.ErrorLevel).All()
	require.Len(t, errs, 2)
	require.Contains(t, errs[0].Message, "may be missing")
	require.EqualValues(t, 7, errs[0].ContextMap()["table"])
}

// A process whose walsender a take-over's Open terminated can reconnect
// before it finds itself fenced, stream on and confirm more than the
// position that Open read. The server then streams to the new source from
// that later LSN, whatever it asks for, so the new source's commit-ts
// chain must continue from the position the earlier process saved there,
// not from the older one (a commit after it could get a commit-ts at or
// below one already delivered, and every table that had it would skip it).
func TestASessionContinuesFromWhereAnotherProcessConfirmed(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t (id int PRIMARY KEY)")
	// The chain runs an hour ahead of the clock (its seed was saved by a
	// clock that was ahead), so each commit's ts is the one before plus 2:
	// B continuing from the older position would give row 3 the ts A gave
	// row 2, which B's table already has, and skip it.
	e.exec("SELECT pg_create_logical_replication_slot('cdcflow', 'pgoutput')")
	ahead := common.TsFromTime(time.Now().Add(time.Hour))
	require.NoError(t, e.pos.Save(context.Background(), "cdcflow", Position{LSN: uint64(e.confirmed()), Ts: ahead}))
	var safe atomic.Uint64
	a := e.source(func(o *testOptions) {
		o.SafePoint = func() (common.Ts, bool) { return common.Ts(safe.Load()), true }
		o.HeartbeatInterval = time.Hour // the stream's commits are the test's three rows
	})
	infoA, err := a.Open(context.Background())
	require.NoError(t, err)
	require.Equal(t, ahead, infoA.ResumeTs)
	ra := newRecordingSink(t, ahead)
	subA, err := a.Subscribe(common.TableSpan(int64(e.oid("t"))), ahead, ra)
	require.NoError(t, err)
	defer subA.Close()
	require.NoError(t, a.Start())
	waitConfirmedPast := func(lsn pglogrepl.LSN) {
		t.Helper()
		testwait.For(t, fmt.Sprintf("the slot confirmed past %v", lsn), func() bool { return e.confirmed() > lsn })
	}
	before := e.lsnNow()
	e.exec("INSERT INTO t VALUES (1)")
	ra.waitFor("row 1", func() bool { return len(ra.rows) == 1 })
	safe.Store(uint64(ra.rows[0].CommitTs))
	waitConfirmedPast(before)

	core, logs := observer.New(zapcore.WarnLevel)
	b := e.source(func(o *testOptions) { o.TakeOver = true; o.Logger = zap.New(core); o.HeartbeatInterval = time.Hour })
	ctx := context.Background()
	info, err := b.Open(ctx) // terminates A's walsender and reads the slot's position
	require.NoError(t, err)
	read := e.confirmed()

	e.exec("INSERT INTO t VALUES (2)") // A reconnects and streams on
	ra.waitFor("row 2, through A's next session", func() bool { return len(ra.rows) == 2 })
	ts2 := ra.rows[1].CommitTs
	require.Equal(t, ts2, info.ResumeTs+2, "the chain runs ahead: row 2 is the position B's Open read plus 2")
	safe.Store(uint64(ts2))
	waitConfirmedPast(read)
	a.Close()

	rb := newRecordingSink(t, ts2)
	sub, err := b.Subscribe(common.TableSpan(int64(e.oid("t"))), ts2, rb)
	require.NoError(t, err)
	defer sub.Close()
	require.NoError(t, b.Start())
	e.exec("INSERT INTO t VALUES (3)")
	rb.waitFor("row 3", func() bool { return len(rb.rows) == 1 })
	require.Equal(t, "3", text(rb.changes()[0], "id"))
	require.Greater(t, rb.rows[0].CommitTs, ts2)
	require.Equal(t, 1, logs.FilterMessageSnippet("continuing from its position").Len(),
		"the chain continues from the position A saved, not the one B's Open read")
}

// A change's rows are copies: the key and value it encodes own their
// bytes, and the scratch it built them in keeps no reference into the
// message (which the connection reuses, and which an idle session would
// otherwise pin). An update that moves its key is a delete of the old key
// and an insert of the new one.
func TestAChangeCopiesItsRowsAndKeepsNoReferenceIntoTheMessage(t *testing.T) {
	rel := pgcodec.Relation{OID: 7, Schema: "public", Name: "t", Columns: []pgcodec.Column{
		{Name: "id", Type: "text", Key: true}, {Name: "v", Type: "text"}}}
	c := testCore(map[uint32]pgcodec.Relation{7: rel})
	msg := []byte("k1v1k2v2")
	tuple := func(k, v []byte) []tupleCol { return []tupleCol{{kind: 't', data: k}, {kind: 't', data: v}} }
	require.NoError(t, c.change(7, pgcodec.Insert, nil, 0, tuple(msg[0:2], msg[2:4])))
	require.NoError(t, c.change(7, pgcodec.Update, tuple(msg[0:2], msg[2:4]), 'K', tuple(msg[4:6], msg[6:8])))
	for _, d := range c.datums[:cap(c.datums)] {
		require.Nil(t, d.Text, "a datum left in the scratch")
	}
	for _, k := range c.keys {
		for _, v := range k[:cap(k)] {
			require.Nil(t, v, "a key column left in the scratch")
		}
	}
	copy(msg, "XXXXXXXX") // the connection reuses its buffer
	rows := c.cur.pending[7]
	require.Len(t, rows, 3)
	want := []struct {
		change pgcodec.Change
		key    string
		cols   []string
	}{{pgcodec.Insert, "k1", []string{"k1", "v1"}}, {pgcodec.Delete, "k1", []string{"k1"}}, {pgcodec.Insert, "k2", []string{"k2", "v2"}}}
	for i, w := range want {
		require.Equal(t, pgcodec.AppendKey(nil, uint32(i+1), [][]byte{[]byte(w.key)}), rows[i].Key, "row %d", i)
		c, err := pgcodec.DecodeValue(rows[i].Value)
		require.NoError(t, err)
		require.Equal(t, w.change, c.Change, "row %d", i)
		var got []string
		for _, d := range c.Columns {
			got = append(got, string(d.Text))
		}
		require.Equal(t, w.cols, got, "row %d", i)
	}
}

// A change whose tuple the relation version in use cannot read (a
// snapshot copy adopted the catalog's version, of another column count,
// while the stream's description is older) is a protocol error of the
// stream, never an index past the tuple's end, whichever of the two has
// more columns.
func TestATupleTheRelationVersionInUseCannotReadIsAnError(t *testing.T) {
	two := []pgcodec.Column{{Name: "id", Type: "text", Key: true}, {Name: "v", Type: "text"}}
	three := append(append([]pgcodec.Column{}, two...), pgcodec.Column{Name: "w", Type: "text"})
	tuple := []tupleCol{{kind: 't', data: []byte("k")}, {kind: 't', data: []byte("v")}}
	for name, inUse := range map[string][]pgcodec.Column{"more columns": three, "fewer columns": two[:1]} {
		c := testCore(map[uint32]pgcodec.Relation{7: {OID: 7, Schema: "public", Name: "t", Columns: inUse}})
		require.ErrorIs(t, c.change(7, pgcodec.Insert, nil, 0, tuple), ErrProtocol, name)
		require.ErrorIs(t, c.change(7, pgcodec.Update, tuple, 'O', tuple), ErrProtocol, name)
		require.Empty(t, c.cur.pending[7], name)
	}
}

// testCore is a core inside a transaction at ts 100, knowing rels, each
// with a description of two columns (id, the key, and v) and a
// subscription.
func testCore(rels map[uint32]pgcodec.Relation) *core {
	c := newCore(newStreamState(rels), Position{}, 1<<20)
	c.subs = map[uint32][]*sub{}
	for oid := range rels {
		c.rels[oid] = &msgRelation{oid: oid, namespace: "public", name: "t", columns: []relColumn{{key: true, name: "id"}, {name: "v"}}}
		c.subs[oid] = []*sub{{oid: oid}}
	}
	c.cur = &txn{ts: 100, pending: map[uint32][]common.Row{}}
	return c
}

// announcement is one OnNewTable call.
type announcement struct {
	rel pgcodec.Relation
	ts  common.Ts
}

// announceInto is an OnNewTable that records each call on ch.
func announceInto(ch chan<- announcement) func(pgcodec.Relation, common.Ts) {
	return func(rel pgcodec.Relation, ts common.Ts) { ch <- announcement{rel, ts} }
}

// nextAnnouncement waits for the next announcement on ch and checks that
// it is of table name.
func nextAnnouncement(t *testing.T, ch <-chan announcement, name string) announcement {
	t.Helper()
	var a announcement
	select {
	case a = <-ch:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s was never announced", name)
	}
	require.Equal(t, name, a.rel.Name)
	return a
}

package replicate

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/pgsink"
	"github.com/cdcflow/eventservice/pkg/pgsource"
)

// targetExec runs sql on the target (standing in for what an interrupted
// run or an operator left there).
func (p *pair) targetExec(sql string) {
	p.t.Helper()
	conn, err := pgx.Connect(context.Background(), p.dst.DSN)
	require.NoError(p.t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(context.Background(), sql)
	require.NoError(p.t, err, sql)
}

// waitSnapshotRecorded waits until serve recorded its snapshot as done
// in the target.
func (p *pair) waitSnapshotRecorded() {
	p.t.Helper()
	conn, err := pgx.Connect(context.Background(), p.dst.DSN)
	require.NoError(p.t, err)
	defer conn.Close(context.Background())
	testwait.For(p.t, "the snapshot recorded as done", func() bool {
		var n int
		var exists bool
		require.NoError(p.t, conn.QueryRow(context.Background(), "SELECT to_regclass('cdcflow.state') IS NOT NULL").Scan(&exists))
		if exists { // serve creates it once its checks passed
			require.NoError(p.t, conn.QueryRow(context.Background(), "SELECT count(*) FROM cdcflow.state WHERE key LIKE 'snapshot-done:%'").Scan(&n))
		}
		return n > 0
	})
}

// What serve cannot resume it starts over, emptying what an earlier run
// of the changefeed left in the target; each case leaves in the target a
// row the source never had (a stand-in for a row whose delete the new
// slot will never stream), and compare finds the tables equal only if
// serve emptied the target before its snapshot.
//
//   - the changefeed's slot with no saved position and no snapshot record
//     (a start-over interrupted between the slot's creation and its first
//     position): started over, not refused (a slot made by hand, which no
//     changefeed registered, is refused instead:
//     TestABadStartLeavesBothDatabasesAsTheyWere);
//   - a slot whose snapshot never completed (no snapshot-done record);
//   - a new slot on a target this changefeed wrote to (its slot dropped:
//     by an operator, or by a start-over interrupted right after the drop);
//   - a slot with no saved position after a completed snapshot cannot be
//     resumed or started over safely: ErrUnknownSlot, at start.
func TestServeStartsOverWhatItCannotResume(t *testing.T) {
	p := newPair(t)
	for i := 1; i <= 3; i++ {
		p.exec(fmt.Sprintf("CREATE TABLE t%d (id int PRIMARY KEY, v text)", i))
		p.exec(fmt.Sprintf("INSERT INTO t%d SELECT g, 'v' || g FROM generate_series(1, 50) g", i))
	}
	stop, stderr := p.serve(p.config())
	p.waitEqual("the first start")
	p.waitSnapshotRecorded()
	require.NoError(t, stop(), stderr.String())
	p.targetExec("DELETE FROM cdcflow.state")
	p.targetExec("DELETE FROM cdcflow.source_positions")
	p.targetExec("INSERT INTO public.t1 VALUES (999, 'stray')")
	stop, stderr = p.serve(p.config())
	p.waitEqual("a slot without a position started over")
	require.NoError(t, stop(), stderr.String())
	require.Contains(t, stderr.String(), "the initial snapshot did not complete")

	p.targetExec("DELETE FROM cdcflow.state") // the snapshot never recorded as done
	p.targetExec("INSERT INTO public.t1 VALUES (1000, 'stray')")
	p.exec("DELETE FROM t2 WHERE id <= 10")
	stop, stderr = p.serve(p.config())
	p.waitEqual("an incomplete snapshot started over")
	require.NoError(t, stop(), stderr.String())
	require.Contains(t, stderr.String(), "the initial snapshot did not complete")

	p.exec("SELECT pg_drop_replication_slot('cdcflow')")
	p.targetExec("INSERT INTO public.t1 VALUES (1001, 'stray')")
	p.exec("DELETE FROM t3 WHERE id <= 10")
	stop, stderr = p.serve(p.config())
	p.waitEqual("a new slot on a target the changefeed wrote to")
	p.waitSnapshotRecorded()
	require.NoError(t, stop(), stderr.String())
	require.Contains(t, stderr.String(), "a new slot on a target this changefeed wrote to before")

	p.targetExec("DELETE FROM cdcflow.source_positions")
	err := p.runOnce(p.config())
	require.ErrorIs(t, err, ErrSetup)
	require.ErrorIs(t, err, pgsource.ErrUnknownSlot)
}

// A second serve of the same changefeed takes it over: it fences out the
// first one's sink (no transaction of the first commits after the
// second started) and its slot, and the first, finding itself
// superseded, stops with ErrSuperseded while the second replicates.
func TestASecondServeTakesOverAndTheFirstStops(t *testing.T) {
	p := newPair(t)
	p.exec("CREATE TABLE t1 (id int PRIMARY KEY, v text)")
	p.exec("INSERT INTO t1 SELECT g, 'v' || g FROM generate_series(1, 50) g")
	ctxA, cancelA := context.WithCancel(context.Background())
	defer cancelA()
	stderrA := &syncBuffer{}
	doneA := make(chan error, 1)
	go func() { doneA <- Run(ctxA, p.config(), stderrA) }()
	p.waitEqual("the first serve")

	stopB, stderrB := p.serve(p.config())
	select {
	case err := <-doneA:
		require.ErrorIs(t, err, pgsink.ErrSuperseded, stderrA.String())
	case <-time.After(2 * time.Minute):
		t.Fatalf("the first serve never stopped:\n%s", stderrA.String())
	}
	p.exec("INSERT INTO t1 VALUES (51, 'after the take-over')")
	p.exec("DELETE FROM t1 WHERE id <= 5")
	p.waitEqual("the second serve")
	require.NoError(t, stopB(), stderrB.String())
}

// targetCount counts the target's rows of table matching where.
func (p *pair) targetCount(table, where string) int {
	p.t.Helper()
	conn, err := pgx.Connect(context.Background(), p.dst.DSN)
	require.NoError(p.t, err)
	defer conn.Close(context.Background())
	var n int
	require.NoError(p.t, conn.QueryRow(context.Background(), "SELECT count(*) FROM "+table+" WHERE "+where).Scan(&n))
	return n
}

// targetCountOrNone is the rows of table in the target, -1 while it does
// not exist there.
func (p *pair) targetCountOrNone(table string) int {
	p.t.Helper()
	conn, err := pgx.Connect(context.Background(), p.dst.DSN)
	require.NoError(p.t, err)
	defer conn.Close(context.Background())
	var exists bool
	require.NoError(p.t, conn.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", table).Scan(&exists))
	if !exists {
		return -1
	}
	var n int
	require.NoError(p.t, conn.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n))
	return n
}

// A start that failed after its sink had started (here a process that
// died right after: its sink fenced the target, raising the owner's
// generation, and wrote nothing) left the target as it was. The next
// start, with a new slot, copies the snapshot into the target's tables as
// they are: a row the target had of its own stays. Had the raised owner
// generation alone meant "this changefeed wrote here", it would have
// emptied the target first.
func TestAStartThatWroteNothingLeavesTheTargetAlone(t *testing.T) {
	p := newPair(t)
	p.exec("CREATE TABLE t1 (id int PRIMARY KEY, v text)")
	p.exec("INSERT INTO t1 SELECT g, 'v' || g FROM generate_series(1, 5) g")
	p.targetExec("CREATE TABLE public.t1 (id int PRIMARY KEY, v text)")
	p.targetExec("INSERT INTO public.t1 VALUES (1000, 'the target''s own')")
	sink, err := pgsink.New(pgsink.Options{DSN: p.dst.DSN, Owner: "cdcflow", SoleOwner: true})
	require.NoError(t, err)
	require.NoError(t, sink.Start(context.Background()))
	require.Equal(t, int64(1), sink.Generation())
	sink.Close()

	stop, stderr := p.serve(p.config())
	p.waitSnapshotRecorded()
	require.NoError(t, stop(), stderr.String())
	require.NotContains(t, stderr.String(), "emptying the target")
	require.Equal(t, 5, p.targetCount("public.t1", "id <= 5"), "the snapshot")
	require.Equal(t, 1, p.targetCount("public.t1", "id = 1000"), "the target's own row")
}

// A new slot's start-over interrupted after the slot was created (here its
// reset fails: the target has a foreign key into a replicated table, so
// the TRUNCATE is refused, exit 2) must start over again at the next start,
// never resume: the earlier slot's snapshot record is cleared before the
// new slot exists. Left in place, the next start would find a slot, its
// first position and a record, and resume without a snapshot, keeping the
// rows deleted at the source while the slot was gone.
func TestAStartOverInterruptedAfterTheSlotsCreationStartsOverAgain(t *testing.T) {
	p := newPair(t)
	p.exec("CREATE TABLE t1 (id int PRIMARY KEY, v text)")
	p.exec("INSERT INTO t1 SELECT g, 'v' || g FROM generate_series(1, 50) g")
	stop, stderr := p.serve(p.config())
	p.waitEqual("the first snapshot")
	p.waitSnapshotRecorded()
	require.NoError(t, stop(), stderr.String())

	p.exec("SELECT pg_drop_replication_slot('cdcflow')")
	p.exec("DELETE FROM t1 WHERE id <= 10") // while no slot was there to see it
	p.targetExec("CREATE TABLE public.pins (id int REFERENCES public.t1 (id))")
	err := p.runOnce(p.config())
	require.ErrorIs(t, err, ErrSetup)
	require.ErrorContains(t, err, "truncate")

	p.targetExec("DROP TABLE public.pins")
	stop, stderr = p.serve(p.config())
	p.waitEqual("the start-over after the interrupted one")
	require.NoError(t, stop(), stderr.String())
	require.Contains(t, stderr.String(), "the initial snapshot did not complete")
}

// A clean stop right after the initial snapshot is applied records it as
// done, so the next start resumes instead of copying every table again.
// The loop that records it otherwise is held back for an hour: without
// the record at the stop, the restart would start over.
func TestACleanStopRecordsTheSnapshotItApplied(t *testing.T) {
	p := newPair(t)
	for i := 1; i <= 3; i++ {
		p.exec(fmt.Sprintf("CREATE TABLE t%d (id int PRIMARY KEY, v text)", i))
		p.exec(fmt.Sprintf("INSERT INTO t%d SELECT g, 'v' || g FROM generate_series(1, 50) g", i))
	}
	p.exec("CREATE TABLE empty (id int PRIMARY KEY)") // its checkpoint alone says it has the snapshot
	cfg := p.config()
	cfg.loopInterval = time.Hour
	stop, stderr := p.serve(cfg)
	p.waitEqual("the snapshot")
	began := time.Now()
	require.NoError(t, stop(), stderr.String())
	t.Logf("the stop took %v", time.Since(began))
	conn, err := pgx.Connect(context.Background(), p.dst.DSN)
	require.NoError(t, err)
	var n int
	require.NoError(t, conn.QueryRow(context.Background(), "SELECT count(*) FROM cdcflow.state WHERE key LIKE 'snapshot-done:%'").Scan(&n))
	require.NoError(t, conn.Close(context.Background()))
	require.Equal(t, 1, n, "the stop recorded the snapshot as done\n%s", stderr.String())

	p.exec("INSERT INTO t1 VALUES (1000, 'after the stop')")
	stop, stderr = p.serve(cfg)
	p.waitEqual("resumed")
	require.NoError(t, stop(), stderr.String())
	require.NotContains(t, stderr.String(), "the initial snapshot did not complete", "resumed, not started over")
}

// A clean stop keeps within --shutdown-timeout as a whole: its quiesce,
// the snapshot's record and the close share the one budget, where each
// had a timeout of its own (a half, a quarter and the whole: up to 1.75
// times the flag). The quiesce here takes its whole half (it waits for
// its context's end, as one does whose table never applies the last
// commit; a stop that did not quiesce records no snapshot) and the close
// is held until the test lets it go: the stop must return when the budget
// is spent, not a whole ShutdownTimeout after the quiesce.
func TestACleanStopKeepsWithinItsTimeout(t *testing.T) {
	p := newPair(t)
	p.exec("CREATE TABLE t (id int PRIMARY KEY)")
	cfg := p.config()
	cfg.ShutdownTimeout = 2 * time.Second
	release, closed := make(chan struct{}), make(chan struct{})
	var letGo sync.Once
	t.Cleanup(func() { // the close goes on after the stop returned: its end is waited for, pass or fail
		letGo.Do(func() { close(release) })
		<-closed
	})
	cfg.stopKnobs = &stopKnobs{
		quiesce: func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() },
		closing: func() { <-release },
		closed:  func() { close(closed) },
	}
	stop, stderr := p.serve(cfg)
	testwait.For(t, "serving (built, the stop is a clean one)", func() bool { return strings.Contains(stderr.String(), "serve: replicating") })
	began := time.Now()
	require.NoError(t, stop(), stderr.String())
	took := time.Since(began)
	letGo.Do(func() { close(release) })
	require.Less(t, took, cfg.ShutdownTimeout*5/4, "the stop took %v\n%s", took, stderr.String())
	require.Contains(t, stderr.String(), "stopping without confirming the last commit to the slot")
	require.Contains(t, stderr.String(), "shutdown timed out")
}

package pgsource

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/common"
)

// reportsForTest counts the stream's status reports: SafePoint is called
// on the stream's goroutine at the start of every report (and nowhere
// else), so a report whose SafePoint call is counted after an event the
// stream's goroutine produced started after that event.
type reportsForTest struct {
	calls atomic.Uint64
	ch    chan struct{}
}

func newReportsForTest() *reportsForTest { return &reportsForTest{ch: make(chan struct{}, 1)} }

// safePoint is the Options.SafePoint of the test: an hour ahead (every
// dispatcher has checkpointed everything, so only the source's own holds
// keep the slot back), counting the call.
func (r *reportsForTest) safePoint() (common.Ts, bool) {
	r.calls.Add(1)
	select {
	case r.ch <- struct{}{}:
	default:
	}
	return common.TsFromTime(time.Now().Add(time.Hour)), true
}

// waitUntil waits, report by report, until cond holds.
func (r *reportsForTest) waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for !cond() {
		select {
		case <-r.ch:
		case <-deadline:
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// maxSaved is the highest LSN ever saved to the position store.
func (p *memPositions) maxSaved() Position {
	p.mu.Lock()
	defer p.mu.Unlock()
	var hi Position
	for _, pos := range p.m {
		if pos.LSN > hi.LSN {
			hi = pos
		}
	}
	return hi
}

// TestTheSlotIsHeldBelowANewTableUntilItIsSubscribed: a table that joined
// the publication (created under FOR ALL TABLES) is announced at its first
// change with that change's commit-ts, and until it is subscribed from
// below it the slot's position (saved to the PositionStore, then confirmed
// to the server) stays before that change, however far commits of other,
// subscribed tables and the safe point go: a restart meanwhile must read
// the new table's first change again, not resume after it. Once
// subscribed, the hold is gone and the position moves past the change.
//
// Interleaving: t1 subscribed and streaming, SafePoint an hour ahead, no
// heartbeat commits; t2 created and its first row committed (the
// announcement's subscription is held back: the test only takes note of
// it); a t1 commit after it reaches t1's sink (pushed within its commit,
// on the stream's goroutine), then two more status reports run, the
// second of which started after that commit was in the stream's journal:
// unheld, it would save and confirm the t1 commit's position, past t2's
// first change. Then t2 is subscribed, and the position is waited past
// t2's first change.
func TestTheSlotIsHeldBelowANewTableUntilItIsSubscribed(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t1 (id int PRIMARY KEY)")
	e.exec("CREATE PUBLICATION cdcflow FOR ALL TABLES") // the user's: a new table is in it at once
	announced := make(chan announcement, 4)
	reports := newReportsForTest()
	src := e.source(func(o *testOptions) {
		o.OnNewTable = announceInto(announced)
		o.SafePoint = reports.safePoint
		o.HeartbeatInterval = time.Hour // the stream's commits are the test's
	})
	_, sinks := openAndSubscribe(t, e, src, "t1")
	t1 := sinks["t1"]
	e.exec("INSERT INTO t1 VALUES (1)")
	t1.waitFor("a row", func() bool { return len(t1.rows) == 1 })

	// t2's first change, with the WAL positions around it.
	e.exec("CREATE TABLE t2 (id int PRIMARY KEY)")
	ctx := context.Background()
	tx, err := e.conn.Begin(ctx)
	require.NoError(t, err)
	var beforeText, afterText string
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&beforeText))
	_, err = tx.Exec(ctx, "INSERT INTO t2 VALUES (1)")
	require.NoError(t, err)
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&afterText))
	require.NoError(t, tx.Commit(ctx))
	before, err := pglogrepl.ParseLSN(beforeText) // at or below t2's first change
	require.NoError(t, err)
	after, err := pglogrepl.ParseLSN(afterText) // above it, below its commit
	require.NoError(t, err)

	a := nextAnnouncement(t, announced, "t2")

	// Commits of a subscribed table after t2's first change, and status
	// reports after they were journaled.
	e.exec("INSERT INTO t1 VALUES (2)")
	e.exec("INSERT INTO t1 VALUES (3)")
	t1.waitFor("the rows after t2's", func() bool { return len(t1.rows) == 3 })
	require.Greater(t, t1.rows[2].CommitTs, a.ts)
	n := reports.calls.Load()
	reports.waitUntil(t, "two status reports", func() bool { return reports.calls.Load() >= n+2 })

	saved := e.pos.maxSaved()
	require.Less(t, saved.Ts, a.ts, "the saved position is before t2's first change's commit-ts")
	require.LessOrEqual(t, pglogrepl.LSN(saved.LSN), before, "no position at or after t2's first change is saved")
	require.LessOrEqual(t, pglogrepl.LSN(src.Position().LSN), before)
	testwait.Within(t, 60*time.Second, "the server's confirmed flush LSN reaches what the source confirms", func() bool { return e.confirmed() >= pglogrepl.LSN(src.Position().LSN) })
	require.LessOrEqual(t, e.confirmed(), before, "the slot is not confirmed past t2's first change")

	// Subscribed from below its first change: the hold is gone.
	sink := newRecordingSink(t, a.ts-1)
	sub, err := src.Subscribe(common.TableSpan(int64(a.rel.OID)), a.ts-1, sink)
	require.NoError(t, err)
	defer sub.Close()
	sink.waitFor("t2's first row", func() bool { return len(sink.rows) == 1 })
	require.Equal(t, a.ts, sink.rows[0].CommitTs)
	reports.waitUntil(t, "the position past t2's first change", func() bool {
		return pglogrepl.LSN(src.Position().LSN) > after
	})
	require.Greater(t, pglogrepl.LSN(e.pos.maxSaved().LSN), after, "saved past t2's first change")
	testwait.Within(t, 60*time.Second, "the server's confirmed flush LSN follows past t2's first change", func() bool { return e.confirmed() > after })
}

package pgsource

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
)

// lsnOf runs query, a single pg_lsn as text, on the source.
func (e *srcEnv) lsnOf(query string) pglogrepl.LSN {
	e.t.Helper()
	var s string
	require.NoError(e.t, e.conn.QueryRow(context.Background(), query).Scan(&s))
	lsn, err := pglogrepl.ParseLSN(s)
	require.NoError(e.t, err)
	return lsn
}

// lsnNow is the source's current WAL position.
func (e *srcEnv) lsnNow() pglogrepl.LSN { return e.lsnOf("SELECT pg_current_wal_lsn()::text") }

// confirmed is the slot's confirmed flush LSN.
func (e *srcEnv) confirmed() pglogrepl.LSN {
	return e.lsnOf("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'cdcflow'")
}

// Quiesce ends the stream at its last commit: every subscription, the one
// whose table had no change included, is resolved to it; once SafePoint
// reaches it, its position is confirmed to the slot, so that the next
// source resumes exactly after the last commit (nothing read again). A
// SafePoint that never gets there leaves the slot where it was, and
// Quiesce fails when its context ends.
func TestQuiesceConfirmsTheLastCommit(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE busy (id int PRIMARY KEY)")
	e.exec("CREATE TABLE idle (id int PRIMARY KEY)")
	var safe atomic.Uint64 // the test's stand-in for every table's durable checkpoint
	src := e.source(func(o *Options) {
		o.StatusInterval, o.ResolvedInterval = time.Hour, time.Hour // only Quiesce confirms, only commits resolve
		o.SafePoint = func() (common.Ts, bool) { return common.Ts(safe.Load()), true }
	})
	_, sinks := openAndSubscribe(t, e, src, "busy", "idle")
	before := e.lsnNow()
	for i := 1; i <= 3; i++ {
		e.exec("INSERT INTO busy VALUES ($1)", i)
	}
	busy, idle := sinks["busy"], sinks["idle"]
	busy.waitFor("three rows", func() bool { return len(busy.rows) == 3 })
	last := busy.rows[2].CommitTs
	require.Equal(t, last, busy.resolved, "a commit resolves the table it wrote")
	require.Less(t, idle.resolved, last, "and only that table")
	require.LessOrEqual(t, e.confirmed(), before, "nothing confirmed yet")

	safe.Store(uint64(last))
	require.NoError(t, src.Quiesce(context.Background()))
	idle.mu.Lock()
	require.Equal(t, last, idle.resolved, "quiesce resolves every table to the last commit")
	idle.mu.Unlock()
	require.Greater(t, e.confirmed(), before, "the last commit is confirmed to the slot")
	require.Error(t, src.Quiesce(context.Background()), "once")
	src.Close()

	next := e.source(nil)
	info, err := next.Open(context.Background())
	require.NoError(t, err)
	require.Equal(t, last, info.ResumeTs, "the next source resumes after the last commit")
	next.Close()

	// A SafePoint that never reaches the last commit.
	stuck := e.source(func(o *Options) {
		o.SafePoint = func() (common.Ts, bool) { return 0, false }
	})
	info, err = stuck.Open(context.Background())
	require.NoError(t, err)
	fourth := newRecordingSink(t, info.ResumeTs)
	sub, err := stuck.Subscribe(common.TableSpan(int64(e.oid("busy"))), info.ResumeTs, fourth)
	require.NoError(t, err)
	defer sub.Close()
	require.NoError(t, stuck.Start())
	e.exec("INSERT INTO busy VALUES (4)")
	fourth.waitFor("a row", func() bool { return len(fourth.rows) == 1 })
	require.Equal(t, "4", text(fourth.changes()[0], "id"), "nothing before the last commit read again")
	held := e.confirmed()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, stuck.Quiesce(ctx), context.DeadlineExceeded)
	require.Equal(t, held, e.confirmed(), "the slot keeps its position")
}

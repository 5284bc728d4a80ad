package pgsource

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
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
	src := e.source(func(o *testOptions) {
		o.StatusInterval, o.ResolvedInterval = time.Hour, time.Hour // only Quiesce confirms, only commits resolve
		// No heartbeat: its commit would become the last one, above the
		// stand-in SafePoint (a loaded machine took the second it waits
		// for, and Quiesce waited forever).
		o.HeartbeatInterval = time.Hour
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
	stuck := e.source(func(o *testOptions) {
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

// A Quiesce that no session can take (the initial snapshot is still being
// copied: here its first push is held) ends with its context instead of
// waiting for the snapshot, and withdraws its request: once the snapshot
// is through, the source streams on, unquiesced.
func TestQuiesceDuringTheSnapshotEndsWithItsContext(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t (id int PRIMARY KEY)")
	e.exec("INSERT INTO t VALUES (1)")
	src := e.source(nil)
	info, err := src.Open(context.Background())
	require.NoError(t, err)
	require.True(t, info.Created)
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	rec := newRecordingSink(t, info.SnapshotTs-1)
	sub, err := src.Subscribe(common.TableSpan(int64(e.oid("t"))), info.SnapshotTs-1, sinkFunc(func(ctx context.Context, b eventstore.Batch) error {
		once.Do(func() {
			close(held)
			select {
			case <-release:
			case <-ctx.Done():
			}
		})
		return rec.Push(ctx, b)
	}))
	require.NoError(t, err)
	defer sub.Close()
	require.NoError(t, src.Start())
	<-held // the snapshot's first push is in the sink

	ctx, cancel := context.WithCancel(context.Background())
	quiesced := make(chan error, 1)
	go func() { quiesced <- src.Quiesce(ctx) }()
	cancel()
	require.ErrorIs(t, <-quiesced, context.Canceled)

	close(release)
	rec.waitFor("the snapshot's row", func() bool { return len(rec.rows) == 1 })
	e.exec("INSERT INTO t VALUES (2)")
	rec.waitFor("a row streamed after the withdrawn Quiesce", func() bool { return len(rec.rows) == 2 })
}

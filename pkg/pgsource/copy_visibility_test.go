package pgsource

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/pgtest"
	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// A commit that the stream has already delivered but that the chunk's
// snapshot cannot see (its transaction waits for a synchronous standby
// that is not there: in the WAL, not yet visible) must not be overwritten
// by the chunk's older row: the copy reads the chunk again, under new
// watermarks, until that commit is visible. Each of the two checks finds
// it alone: the copier's (the transaction waits in SyncRep) and the
// stream's (it decoded the transaction's commit before the low
// watermark). With neither, the copy ends with the row as it was before
// the commit.
func TestACopyWaitsForACommitItsSnapshotCannotSeeYet(t *testing.T) {
	for _, tc := range []struct {
		name string
		only func(*testOptions)
	}{
		{"SyncRepCheck", func(o *testOptions) { o.knobs.skipRecentCheck = true }},
		{"RecentCommitsCheck", func(o *testOptions) { o.knobs.skipSyncRepCheck = true }},
	} {
		t.Run(tc.name, func(t *testing.T) { testACopyWaitsForACommitItsSnapshotCannotSeeYet(t, tc.only) })
	}
}

func testACopyWaitsForACommitItsSnapshotCannotSeeYet(t *testing.T, only func(*testOptions)) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t2 (id int PRIMARY KEY, v text)")
	e.exec("INSERT INTO t2 SELECT g, 'v' || g FROM generate_series(1, 10) g")
	j := streamThenJoin(t, e, "t2", only)
	release := e.waitForAStandby()
	waiting := make(chan error, 1)
	e.commitThatWaits(j, waiting)
	copied := make(chan error, 1)
	var res CopyResult
	go func() {
		var err error
		res, err = j.src.CopyTable(context.Background(), j.oid, false)
		copied <- err
	}()
	deadline := time.Now().Add(60 * time.Second)
	for testutilValue(j.src.met.copyRetries) < 3 {
		select {
		case err := <-copied:
			t.Fatalf("the copy ended (%v) while a commit it cannot see was delivered", err)
		case <-time.After(10 * time.Millisecond):
		}
		require.True(t, time.Now().Before(deadline), "the copy never read its chunk again")
	}
	release()
	require.NoError(t, <-waiting)
	require.NoError(t, <-copied)
	j.sink.waitFor("the copy", func() bool { return j.sink.resolved >= res.Ts })
	got := fold(t, j.sink.changes(), "id")
	require.Equal(t, e.tableRows("t2", "id"), got)
	require.Equal(t, "waited", got["3"]["v"])
}

// The commits decoded before a chunk's low watermark are kept with the
// chunk: a window with more commits than the stream keeps (4096, of any
// table) no longer hides the commit waiting for a standby that the stream
// delivered before it, and the chunk is read again (here once the commit
// is visible). Looked up at the high watermark, the window's commits had
// pushed it out, and the chunk's older row overwrote the commit.
func TestTheRecentCommitsCheckSeesPastABusyWindow(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t2 (id int PRIMARY KEY, v text)")
	e.exec("INSERT INTO t2 SELECT g, 'v' || g FROM generate_series(1, 10) g")
	busy, err := pgx.Connect(context.Background(), e.pg.DSN)
	require.NoError(t, err)
	defer busy.Close(context.Background())
	_, err = busy.Exec(context.Background(), "SET synchronous_commit = local")
	require.NoError(t, err)
	release := e.releasable()
	waiting := make(chan error, 1)
	attempts, first := 0, true
	j := streamThenJoin(t, e, "t2", func(o *testOptions) {
		o.knobs.skipSyncRepCheck = true
		o.knobs.copyStartHook = func() {
			if attempts++; attempts == 2 { // the chunk read again: once the commit is visible
				release()
				require.NoError(t, <-waiting)
			}
		}
		o.knobs.copyHook = func(uint32, int) {
			if !first {
				return
			}
			first = false
			_, err := busy.Exec(context.Background(), fmt.Sprintf(
				"DO $$ BEGIN FOR i IN 1..%d LOOP INSERT INTO t1 VALUES (100 + i); COMMIT; END LOOP; END $$", recentCommits+100))
			require.NoError(t, err)
		}
	})
	e.setSyncStandby("nobody")
	e.commitThatWaits(j, waiting)
	res, err := j.src.CopyTable(context.Background(), j.oid, false)
	require.NoError(t, err)
	require.Equal(t, 1, res.Retries, "the first chunk was read again")
	j.sink.waitFor("the copy", func() bool { return j.sink.resolved >= res.Ts })
	require.Equal(t, "waited", fold(t, j.sink.changes(), "id")["3"]["v"])
}

// commitThatWaits commits "UPDATE t2 SET v = 'waited' WHERE id = 3" on a
// connection of its own, whose commit then waits for the synchronous
// standby that is not there (its error goes to waiting once released),
// and returns once the backend waits and the stream delivered the commit.
func (e *srcEnv) commitThatWaits(j joinedTable, waiting chan<- error) {
	e.t.Helper()
	go func() {
		conn, err := pgx.Connect(context.Background(), e.pg.DSN)
		if err != nil {
			waiting <- err
			return
		}
		defer conn.Close(context.Background())
		_, err = conn.Exec(context.Background(), "UPDATE t2 SET v = 'waited' WHERE id = 3")
		waiting <- err
	}()
	testwait.For(e.t, "a commit waiting for the standby", func() bool {
		var n int
		require.NoError(e.t, e.conn.QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'").Scan(&n))
		return n > 0
	})
	j.sink.waitFor("the stream delivers the waiting commit", func() bool {
		for _, r := range j.sink.rows {
			if c, err := pgcodec.DecodeValue(r.Value); err == nil && text(c, "v") == "waited" {
				return true
			}
		}
		return false
	})
}

// setSyncStandby sets synchronous_standby_names and waits until the
// server has read it: once this test's own backend shows it, the
// postmaster has, and every connection opened after has it too (one
// opened right after pg_reload_conf may not).
func (e *srcEnv) setSyncStandby(name string) {
	pgtest.Set(e.t, e.conn, "synchronous_standby_names", name)
}

// waitForAStandby makes commits wait for a synchronous standby that is
// not there until the returned release (at the latest at the test's end).
func (e *srcEnv) waitForAStandby() (release func()) {
	e.setSyncStandby("nobody")
	return e.releasable()
}

// releasable returns a release of the synchronous standby setting that
// runs once, and at the test's end if not before.
func (e *srcEnv) releasable() (release func()) {
	released := false
	release = func() {
		if !released {
			released = true
			e.setSyncStandby("")
		}
	}
	e.t.Cleanup(release)
	return release
}

package pgsource

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// fold applies a table's changes, in the order pushed, to a map from the
// key column's text to the row's columns (what an upserting sink holds).
func fold(t *testing.T, changes []pgcodec.RowChange, key string) map[string]map[string]string {
	t.Helper()
	rows := map[string]map[string]string{}
	for _, c := range changes {
		switch c.Change {
		case pgcodec.Truncate:
			rows = map[string]map[string]string{}
			continue
		case pgcodec.Move:
			old := rows[string(c.From[0].Text)]
			delete(rows, string(c.From[0].Text))
			rows[text(c, key)] = old
		}
		k := text(c, key)
		if c.Change == pgcodec.Delete {
			delete(rows, k)
			continue
		}
		row := rows[k]
		if row == nil {
			row = map[string]string{}
			rows[k] = row
		}
		for _, d := range c.Columns {
			if d.Kind != pgcodec.Unchanged {
				row[d.Name] = text(c, d.Name)
			}
		}
	}
	return rows
}

// tableRows reads a source table the way fold keeps it.
func (e *srcEnv) tableRows(table, key string) map[string]map[string]string {
	e.t.Helper()
	rows, err := e.conn.Query(context.Background(), "SELECT * FROM "+table)
	require.NoError(e.t, err)
	out := map[string]map[string]string{}
	for rows.Next() {
		vals, err := rows.Values()
		require.NoError(e.t, err)
		row := map[string]string{}
		for i, f := range rows.FieldDescriptions() {
			row[f.Name] = "<null>"
			if vals[i] != nil {
				row[f.Name] = fmt.Sprint(vals[i])
			}
		}
		out[row[key]] = row
	}
	require.NoError(e.t, rows.Err())
	return out
}

// joinedTable is a table that joins the publication while streaming,
// announced, subscribed from where the announcement says.
type joinedTable struct {
	src  *Source
	sink *recordingSink
	oid  uint32
	from common.Ts
}

// streamThenJoin starts a source on a publication of t1 only, then adds
// table to it and waits for the poll to announce it (it has no change in
// the stream) and subscribes it.
func streamThenJoin(t *testing.T, e *srcEnv, table string, tweak func(*Options)) joinedTable {
	t.Helper()
	e.exec("CREATE TABLE t1 (id int PRIMARY KEY)")
	e.exec("CREATE PUBLICATION only_t1 FOR TABLE t1")
	announced := make(chan common.Ts, 4)
	src := e.source(func(o *Options) {
		o.Publication = "only_t1"
		o.PublicationPollInterval = 20 * time.Millisecond
		o.OnNewTable = func(rel pgcodec.Relation, ts common.Ts) {
			if rel.Name == table {
				announced <- ts
			}
		}
		if tweak != nil {
			tweak(o)
		}
	})
	_, sinks := openAndSubscribe(t, e, src, "t1")
	e.exec("INSERT INTO t1 VALUES (1)")
	sinks["t1"].waitFor("t1 streams", func() bool { return len(sinks["t1"].rows) == 1 })
	e.exec("ALTER PUBLICATION only_t1 ADD TABLE " + table)
	var from common.Ts
	select {
	case from = <-announced:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s was never announced", table)
	}
	j := joinedTable{src: src, sink: newRecordingSink(t, from-1), oid: e.oid(table), from: from}
	sub, err := src.Subscribe(common.TableSpan(int64(j.oid)), from-1, j.sink)
	require.NoError(t, err)
	t.Cleanup(sub.Close)
	return j
}

// A table added to the publication with rows in it and no change since is
// found by the poll and copied in chunks, while it is written to: a row
// changed or deleted after a chunk's snapshot and before its high
// watermark keeps the stream's version (the chunk's older one is dropped),
// so what the subscription folds to is the table. Without the window's
// key tracking the chunk's row would overwrite the update and bring the
// deleted row back.
func TestATableThatJoinsWithRowsIsCopiedWhileWrittenTo(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t2 (id int PRIMARY KEY, v text, n int)")
	e.exec("INSERT INTO t2 SELECT g, 'v' || g, g FROM generate_series(1, 1000) g")
	writer, err := pgx.Connect(context.Background(), e.pg.DSN)
	require.NoError(t, err)
	defer writer.Close(context.Background())
	chunks := 0
	j := streamThenJoin(t, e, "t2", func(o *Options) {
		o.CopyChunkRows = 300
		o.copyHook = func(_ uint32, rows int) {
			// After the chunk's snapshot, before its high watermark: the
			// chunk holds the rows as they were.
			chunks++
			if chunks > 1 {
				return
			}
			for _, q := range []string{"UPDATE t2 SET v = 'changed' WHERE id = 1", "DELETE FROM t2 WHERE id = 2",
				"INSERT INTO t2 VALUES (5000, 'new', 0)", "UPDATE t2 SET n = -1 WHERE id = 700"} {
				_, err := writer.Exec(context.Background(), q)
				require.NoError(t, err)
			}
		}
	})
	res, err := j.src.CopyTable(context.Background(), j.oid)
	require.NoError(t, err)
	require.Equal(t, 4, res.Chunks, "1000 rows and one more in chunks of 300")
	require.Equal(t, int64(999), res.Rows, "ids 3-1000 and 5000: the first chunk's window touched ids 1 and 2")
	require.Greater(t, res.Ts, j.from)
	e.exec("UPDATE t2 SET v = 'after' WHERE id = 3")
	want := e.tableRows("t2", "id")
	j.sink.waitFor("the copy and the changes around it", func() bool { return len(j.sink.rows) == 4+999+1 })
	got := fold(t, j.sink.changes(), "id")
	require.Equal(t, len(want), len(got))
	require.Equal(t, want, got)
	require.Equal(t, 999.0, testutilValue(j.src.met.copyRows))
}

// pgoutput's rows are not always whole: an update in a chunk's window
// that leaves a TOASTed value unchanged (of a row the target does not
// have yet: the chunk's row is dropped, the stream's lacks the value) and
// a move at any time of the copy (a key change leaving it unchanged, from
// a row not copied yet to a key whose range was) are read again once the
// ranges are done, so the value arrives. Without reading them again both
// rows fold without their body.
func TestRowsLeftWithoutAnUnchangedValueAreReadAgain(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t2 (id int PRIMARY KEY, v text, body text)")
	e.exec("ALTER TABLE t2 ALTER COLUMN body SET STORAGE EXTERNAL")
	e.exec("INSERT INTO t2 SELECT g, 'v' || g, repeat(md5(g::text), 100) FROM generate_series(1, 100) g")
	writer, err := pgx.Connect(context.Background(), e.pg.DSN)
	require.NoError(t, err)
	defer writer.Close(context.Background())
	chunks := 0
	j := streamThenJoin(t, e, "t2", func(o *Options) {
		o.CopyChunkRows = 30
		o.copyHook = func(uint32, int) {
			chunks++
			switch chunks {
			case 1: // in the first chunk's window
				_, err := writer.Exec(context.Background(), "UPDATE t2 SET v = 'changed' WHERE id = 5")
				require.NoError(t, err)
			case 2: // a row of a later range moves to the copied one
				_, err := writer.Exec(context.Background(), "UPDATE t2 SET id = -90 WHERE id = 90")
				require.NoError(t, err)
			}
		}
	})
	res, err := j.src.CopyTable(context.Background(), j.oid)
	require.NoError(t, err)
	require.Equal(t, 2, res.Refetched, "id 5 and id -90")
	j.sink.waitFor("the copy", func() bool { return j.sink.resolved >= res.Ts })
	got := fold(t, j.sink.changes(), "id")
	want := e.tableRows("t2", "id")
	require.Equal(t, want["5"], got["5"])
	require.Equal(t, want["-90"], got["-90"])
	require.Equal(t, want, got)
}

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
		only func(*Options)
	}{
		{"SyncRepCheck", func(o *Options) { o.skipRecentCheck = true }},
		{"RecentCommitsCheck", func(o *Options) { o.skipSyncRepCheck = true }},
	} {
		t.Run(tc.name, func(t *testing.T) { testACopyWaitsForACommitItsSnapshotCannotSeeYet(t, tc.only) })
	}
}

func testACopyWaitsForACommitItsSnapshotCannotSeeYet(t *testing.T, only func(*Options)) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t2 (id int PRIMARY KEY, v text)")
	e.exec("INSERT INTO t2 SELECT g, 'v' || g FROM generate_series(1, 10) g")
	j := streamThenJoin(t, e, "t2", only)
	e.exec("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
	e.exec("SELECT pg_reload_conf()")
	released := false
	release := func() {
		if !released {
			released = true
			e.exec("ALTER SYSTEM RESET synchronous_standby_names")
			e.exec("SELECT pg_reload_conf()")
		}
	}
	t.Cleanup(release)
	waiting := make(chan error, 1)
	go func() {
		conn, err := pgx.Connect(context.Background(), e.pg.DSN)
		if err != nil {
			waiting <- err
			return
		}
		defer conn.Close(context.Background())
		_, err = conn.Exec(context.Background(), "UPDATE t2 SET v = 'waited' WHERE id = 3") // commits, then waits
		waiting <- err
	}()
	j.sink.waitFor("the stream delivers the waiting commit", func() bool {
		for _, r := range j.sink.rows {
			if c, err := pgcodec.DecodeValue(r.Value); err == nil && text(c, "v") == "waited" {
				return true
			}
		}
		return false
	})
	copied := make(chan error, 1)
	var res CopyResult
	go func() {
		var err error
		res, err = j.src.CopyTable(context.Background(), j.oid)
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

// A truncate in a chunk's window sends the chunk back (its rows may be
// from before the truncate); read again, the table's rows after it are
// copied, none from before.
func TestATruncateInAChunksWindowReadsItAgain(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t2 (id int PRIMARY KEY, v text)")
	e.exec("INSERT INTO t2 SELECT g, 'old' FROM generate_series(1, 50) g")
	writer, err := pgx.Connect(context.Background(), e.pg.DSN)
	require.NoError(t, err)
	defer writer.Close(context.Background())
	first := true
	j := streamThenJoin(t, e, "t2", func(o *Options) {
		o.copyHook = func(uint32, int) {
			if first {
				first = false
				_, err := writer.Exec(context.Background(), "TRUNCATE t2; INSERT INTO t2 VALUES (7, 'new')")
				require.NoError(t, err)
			}
		}
	})
	res, err := j.src.CopyTable(context.Background(), j.oid)
	require.NoError(t, err)
	require.Equal(t, 1, res.Retries)
	require.Equal(t, int64(1), res.Rows)
	j.sink.waitFor("the copy", func() bool { return j.sink.resolved >= res.Ts })
	got := fold(t, j.sink.changes(), "id")
	require.Equal(t, map[string]map[string]string{"7": {"id": "7", "v": "new"}}, got)
}

func TestChunkQueryContinuesAfterTheKeyInKeyOrder(t *testing.T) {
	rel := pgcodec.Relation{Schema: "s", Name: "t", Columns: []pgcodec.Column{
		{Name: "a", Type: "integer", Key: true}, {Name: "v", Type: "text"}, {Name: "b", Type: "character varying(5)", Key: true}}}
	q, args := chunkQuery(rel, readScope{from: `"s"."t" t`}, []int{0, 1}, nil, 10)
	require.Equal(t, `SELECT t."a", t."v", t."b" FROM "s"."t" t ORDER BY t."a", t."b" LIMIT 10`, q)
	require.Empty(t, args)
	q, args = chunkQuery(rel, readScope{from: `"s"."t" t`}, []int{0, 1}, [][]byte{[]byte("3"), []byte("x'y")}, 10)
	require.Equal(t, `SELECT t."a", t."v", t."b" FROM "s"."t" t WHERE (t."a", t."b") > ($1::text::integer, $2::text::character varying(5)) ORDER BY t."a", t."b" LIMIT 10`, q)
	require.Equal(t, []any{"3", "x'y"}, args)
	// PRIMARY KEY (b, a): the index's order, the key parts still in column order.
	q, args = chunkQuery(rel, readScope{from: `"s"."t" t`}, []int{1, 0}, [][]byte{[]byte("3"), []byte("x")}, 10)
	require.Equal(t, `SELECT t."a", t."v", t."b" FROM "s"."t" t WHERE (t."b", t."a") > ($1::text::character varying(5), $2::text::integer) ORDER BY t."b", t."a" LIMIT 10`, q)
	require.Equal(t, []any{"x", "3"}, args)
	q, args = keyedQuery(rel, readScope{from: `"s"."t" t`, filter: "v <> 'x'"}, [][][]byte{{[]byte("1"), []byte("p")}, {[]byte("too few")}})
	require.Equal(t, `SELECT t."a", t."v", t."b" FROM "s"."t" t WHERE (v <> 'x') AND (t."a", t."b") IN (($1::text::integer, $2::text::character varying(5)))`, q,
		"a key noted under another key's shape is left out")
	require.Equal(t, []any{"1", "p"}, args)
	require.Equal(t, []uint32{7, 9, 5}, snapshotInProgress("5:4294967310:7,9,4294967301"), "xid8s as 32-bit xids")
	require.Empty(t, snapshotInProgress("5:5:"))
	keys := []string{windowKey([][]byte{[]byte("ab"), []byte("c")}), windowKey([][]byte{[]byte("a"), []byte("bc")})}
	sort.Strings(keys)
	require.NotEqual(t, keys[0], keys[1], "parts are length-prefixed")
	require.False(t, strings.Contains(keys[0], "abc"))
}

// The chunk reads its rows in the text of the columns' output functions,
// as pgoutput prints them: a key whose cast to text prints differently
// (a bool: "true" against pgoutput's "t"; char(n) without its padding;
// inet with its /32) was never found touched in the window, and the
// chunk's stale rows undid the update and brought the deleted row back.
func TestAKeyACastWouldPrintDifferentlyIsFoundTouched(t *testing.T) {
	for _, tc := range []struct{ name, ddl, ins, upd, del string }{
		{"char", "CREATE TABLE t2 (id char(6) PRIMARY KEY, v text)", "INSERT INTO t2 SELECT 'k' || g, 'v' || g FROM generate_series(1, 100) g",
			"UPDATE t2 SET v = 'changed' WHERE id = 'k1'", "DELETE FROM t2 WHERE id = 'k2'"},
		{"bool", "CREATE TABLE t2 (id int, f bool, v text, PRIMARY KEY (id, f))", "INSERT INTO t2 SELECT g, true, 'v' || g FROM generate_series(1, 100) g",
			"UPDATE t2 SET v = 'changed' WHERE id = 1", "DELETE FROM t2 WHERE id = 2"},
		{"inet", "CREATE TABLE t2 (id inet PRIMARY KEY, v text)", "INSERT INTO t2 SELECT ('10.0.0.' || g)::inet, 'v' || g FROM generate_series(1, 100) g",
			"UPDATE t2 SET v = 'changed' WHERE id = '10.0.0.1'", "DELETE FROM t2 WHERE id = '10.0.0.2'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newSrcEnv(t)
			e.exec(tc.ddl)
			e.exec(tc.ins)
			writer, err := pgx.Connect(context.Background(), e.pg.DSN)
			require.NoError(t, err)
			defer writer.Close(context.Background())
			first := true
			j := streamThenJoin(t, e, "t2", func(o *Options) {
				o.copyHook = func(uint32, int) {
					if first {
						first = false
						for _, q := range []string{tc.upd, tc.del} {
							_, err := writer.Exec(context.Background(), q)
							require.NoError(t, err)
						}
					}
				}
			})
			res, err := j.src.CopyTable(context.Background(), j.oid)
			require.NoError(t, err)
			require.Equal(t, int64(98), res.Rows, "the two rows the window touched are the stream's")
			j.sink.waitFor("the copy", func() bool { return j.sink.resolved >= res.Ts })
			changed := 0
			for _, row := range fold(t, j.sink.changes(), "v") {
				if row["v"] == "changed" {
					changed++
				}
			}
			require.Equal(t, 1, changed)
			require.Len(t, fold(t, j.sink.changes(), "v"), 99, "the deleted row stays deleted")
		})
	}
}

// A rewrite of the table (ALTER TABLE ... TYPE) that holds it while the
// next chunk begins: the chunk locks the table before it takes its
// snapshot, so it waits for the rewrite and sees the rewritten table. A
// snapshot taken before the rewrite's commit saw it empty, and the copy
// ended there with the other rows never copied.
func TestARewriteDuringACopyDoesNotEndIt(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t2 (id int PRIMARY KEY, v text, n int)")
	e.exec("INSERT INTO t2 SELECT g, 'v' || g, g FROM generate_series(1, 1000) g")
	alter, err := pgx.Connect(context.Background(), e.pg.DSN)
	require.NoError(t, err)
	defer alter.Close(context.Background())
	chunks := 0
	committed := make(chan error, 1)
	j := streamThenJoin(t, e, "t2", func(o *Options) {
		o.CopyChunkRows = 300
		o.copyHook = func(uint32, int) {
			if chunks++; chunks != 1 {
				return
			}
			tx, err := alter.Begin(context.Background())
			require.NoError(t, err)
			_, err = tx.Exec(context.Background(), "ALTER TABLE t2 ALTER COLUMN n TYPE bigint")
			require.NoError(t, err)
			go func() {
				// Commit once the copy's next chunk waits for the table.
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				watch, err := pgx.Connect(ctx, e.pg.DSN)
				if err != nil {
					committed <- err
					return
				}
				defer watch.Close(context.Background())
				for {
					var waiting bool
					if err := watch.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_locks WHERE relation = 't2'::regclass AND NOT granted)").Scan(&waiting); err != nil {
						committed <- err
						return
					}
					if waiting {
						committed <- tx.Commit(context.Background())
						return
					}
				}
			}()
		}
	})
	res, err := j.src.CopyTable(context.Background(), j.oid)
	require.NoError(t, err)
	require.NoError(t, <-committed)
	require.Equal(t, int64(1000), res.Rows, "every row copied")
	j.sink.waitFor("the copy", func() bool { return j.sink.resolved >= res.Ts })
	require.Len(t, fold(t, j.sink.changes(), "id"), 1000)
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
	released := false
	release := func() {
		if !released {
			released = true
			e.exec("ALTER SYSTEM RESET synchronous_standby_names")
			e.exec("SELECT pg_reload_conf()")
		}
	}
	t.Cleanup(release)
	waiting := make(chan error, 1)
	attempts, first := 0, true
	j := streamThenJoin(t, e, "t2", func(o *Options) {
		o.skipSyncRepCheck = true
		o.copyStartHook = func() {
			if attempts++; attempts == 2 { // the chunk read again: once the commit is visible
				release()
				require.NoError(t, <-waiting)
			}
		}
		o.copyHook = func(uint32, int) {
			if !first {
				return
			}
			first = false
			_, err := busy.Exec(context.Background(), fmt.Sprintf(
				"DO $$ BEGIN FOR i IN 1..%d LOOP INSERT INTO t1 VALUES (100 + i); COMMIT; END LOOP; END $$", recentCommits+100))
			require.NoError(t, err)
		}
	})
	e.exec("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
	e.exec("SELECT pg_reload_conf()")
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
	j.sink.waitFor("the stream delivers the waiting commit", func() bool {
		for _, r := range j.sink.rows {
			if c, err := pgcodec.DecodeValue(r.Value); err == nil && text(c, "v") == "waited" {
				return true
			}
		}
		return false
	})
	res, err := j.src.CopyTable(context.Background(), j.oid)
	require.NoError(t, err)
	require.Equal(t, 1, res.Retries, "the first chunk was read again")
	j.sink.waitFor("the copy", func() bool { return j.sink.resolved >= res.Ts })
	require.Equal(t, "waited", fold(t, j.sink.changes(), "id")["3"]["v"])
}

// A table dropped between two chunks ends its copy with ErrTableGone
// (serve then takes it off its list and copies the next): resolving a
// dropped OID's name gives the number, and the copy had gone round for
// good on the LOCK that number made fail.
func TestADroppedTableEndsItsCopy(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t2 (id int PRIMARY KEY, v text)")
	e.exec("INSERT INTO t2 SELECT g, 'v' || g FROM generate_series(1, 1000) g")
	dropper, err := pgx.Connect(context.Background(), e.pg.DSN)
	require.NoError(t, err)
	defer dropper.Close(context.Background())
	chunks := 0
	j := streamThenJoin(t, e, "t2", func(o *Options) {
		o.CopyChunkRows = 300
		o.copyHook = func(uint32, int) {
			if chunks++; chunks == 1 {
				_, err := dropper.Exec(context.Background(), "DROP TABLE t2")
				require.NoError(t, err)
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := j.src.CopyTable(ctx, j.oid)
	require.ErrorIs(t, err, ErrTableGone, "%+v", res)
}

// PRIMARY KEY (id) INCLUDE (v): the key is (id), as pgoutput marks it; the
// catalog had taken the INCLUDE column for a key column too, and the
// copy's relation then changed the table's key (which stops it).
func TestAnIncludedColumnIsNotPartOfTheKey(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t2 (id int, v text NOT NULL, PRIMARY KEY (id) INCLUDE (v))")
	e.exec("INSERT INTO t2 SELECT g, 'v' || g FROM generate_series(1, 100) g")
	writer, err := pgx.Connect(context.Background(), e.pg.DSN)
	require.NoError(t, err)
	defer writer.Close(context.Background())
	first := true
	j := streamThenJoin(t, e, "t2", func(o *Options) {
		o.copyHook = func(uint32, int) {
			if first {
				first = false
				for _, q := range []string{"UPDATE t2 SET v = 'changed' WHERE id = 1", "DELETE FROM t2 WHERE id = 2"} {
					_, err := writer.Exec(context.Background(), q)
					require.NoError(t, err)
				}
			}
		}
	})
	res, err := j.src.CopyTable(context.Background(), j.oid)
	require.NoError(t, err)
	j.sink.waitFor("the copy", func() bool { return j.sink.resolved >= res.Ts })
	got := fold(t, j.sink.changes(), "id")
	ddls, err := e.schema.FetchDDLs(int64(j.oid), 0, e.schema.ResolvedTs(), nil)
	require.NoError(t, err)
	require.NotEmpty(t, ddls)
	for _, d := range ddls {
		r, err := pgcodec.ParseRelationDDL(d.Query)
		require.NoError(t, err)
		require.Equal(t, []string{"id"}, r.KeyColumns(), "the relation at %v", d.CommitTs)
	}
	require.Equal(t, "changed", got["1"]["v"])
	require.NotContains(t, got, "2")
}

// A copied row's text is pgoutput's, column by column, for 35 types (the
// copy's rows, then the same rows as an update streams them).
func TestACopiedRowPrintsLikeTheStream(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TYPE mood AS ENUM ('sad', 'ok')")
	e.exec("CREATE TYPE pair AS (a int, b text)")
	e.exec("CREATE DOMAIN posint AS int CHECK (VALUE > 0)")
	e.exec(`CREATE TABLE t2 (id int PRIMARY KEY, b bytea, j json, jb jsonb, ai int[], at text[], m mood, p pair, d posint,
 ts timestamptz, tz timestamp, iv interval, f4 real, f8 float8, nu numeric, mo money, u uuid, bi bit(5), vb varbit,
 tv tsvector, r int4range, pt point, x xml, c char(4), ip inet, cid cidr, mac macaddr, dt date, tt time, ttz timetz,
 ma mood[], pa pair[], bl bool, oi oid, rc regclass, nm name, hs int8range[])`)
	e.exec(`INSERT INTO t2 SELECT g, '\x00ff'::bytea, '{"a": [1, 2]}', '{"b": 1, "a": "x"}', '{1,NULL,3}', '{"a b","c,d",NULL,"\"q\""}',
 'ok', ROW(1, 'x y')::pair, 5, '2024-01-02 03:04:05.123456+02', '2024-01-02 03:04:05', '1 day 02:03:04', 0.1, 0.1, 1.50, 12.34,
 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', B'10101', B'101', 'a fat cat', '[1,5)', '(1.5,2)', '<a>x</a>', 'ab', '10.0.0.1/32', '10.0.0.0/8',
 '08:00:2b:01:02:03', '2024-01-02', '03:04:05', '03:04:05+02', '{sad,ok}', ARRAY[ROW(1,'a')::pair, ROW(2,NULL)::pair], true, 42, 'pg_class'::regclass, 'nm',
 ARRAY['[1,2)'::int8range]
 FROM generate_series(1, 5) g`)
	j := streamThenJoin(t, e, "t2", nil)
	res, err := j.src.CopyTable(context.Background(), j.oid)
	require.NoError(t, err)
	j.sink.waitFor("the copy", func() bool { return j.sink.resolved >= res.Ts })
	e.exec("UPDATE t2 SET id = id")
	j.sink.waitFor("the update", func() bool {
		n := 0
		for _, r := range j.sink.rows {
			if c, err := pgcodec.DecodeValue(r.Value); err == nil && c.Change == pgcodec.Update {
				n++
			}
		}
		return n == 5
	})
	copied, streamed := map[string]pgcodec.RowChange{}, map[string]pgcodec.RowChange{}
	for _, c := range j.sink.changes() {
		switch c.Change {
		case pgcodec.Insert:
			copied[text(c, "id")] = c
		case pgcodec.Update:
			streamed[text(c, "id")] = c
		}
	}
	require.Len(t, copied, 5)
	for k, c := range copied {
		s := streamed[k]
		for _, d := range c.Columns {
			if text(c, d.Name) != text(s, d.Name) {
				t.Errorf("%s: copy %q stream %q", d.Name, text(c, d.Name), text(s, d.Name))
			}
		}
	}
}

// An inheritance parent's copy is its own rows: pgoutput publishes a
// child's rows as the child's, and the parent's target would have kept
// them for good.
func TestAnInheritanceParentsCopyIsItsOwnRows(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t2 (id int PRIMARY KEY, v text)")
	e.exec("CREATE TABLE t2c (PRIMARY KEY (id)) INHERITS (t2)")
	e.exec("INSERT INTO t2 SELECT g, 'p' FROM generate_series(1, 10) g")
	e.exec("INSERT INTO t2c SELECT g, 'c' FROM generate_series(101, 110) g")
	j := streamThenJoin(t, e, "t2", nil)
	res, err := j.src.CopyTable(context.Background(), j.oid)
	require.NoError(t, err)
	j.sink.waitFor("the copy", func() bool { return j.sink.resolved >= res.Ts })
	require.Len(t, fold(t, j.sink.changes(), "id"), 10, "only the parent's own rows")
}

// A key that gains a column between two chunks: the next chunk starts from
// the first row again (the key change stops the table in the sink) where
// it indexed the last key's parts past their end and took the process
// down.
func TestAKeyThatWidensBetweenChunksDoesNotPanic(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t2 (id int, b int NOT NULL, v text, CONSTRAINT t2_pkey PRIMARY KEY (id))")
	e.exec("INSERT INTO t2 SELECT g, g, 'v' FROM generate_series(1, 100) g")
	alter, err := pgx.Connect(context.Background(), e.pg.DSN)
	require.NoError(t, err)
	defer alter.Close(context.Background())
	chunks := 0
	j := streamThenJoin(t, e, "t2", func(o *Options) {
		o.CopyChunkRows = 30
		o.copyHook = func(uint32, int) {
			if chunks++; chunks == 1 {
				_, err := alter.Exec(context.Background(), "ALTER TABLE t2 DROP CONSTRAINT t2_pkey, ADD PRIMARY KEY (id, b)")
				require.NoError(t, err)
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := j.src.CopyTable(ctx, j.oid)
	require.NoError(t, err)
	require.GreaterOrEqual(t, res.Rows, int64(100), "every row, some twice")
}

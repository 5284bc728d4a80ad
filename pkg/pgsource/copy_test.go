package pgsource

import (
	"context"
	"fmt"
	"math"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/testwait"
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
func streamThenJoin(t *testing.T, e *srcEnv, table string, tweak func(*testOptions)) joinedTable {
	t.Helper()
	e.exec("CREATE TABLE t1 (id int PRIMARY KEY)")
	e.exec("CREATE PUBLICATION only_t1 FOR TABLE t1")
	announced := make(chan common.Ts, 4)
	src := e.source(func(o *testOptions) {
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
	if src.opts.PublicationPollInterval < 0 {
		// No poll: a change announces it.
		e.exec("UPDATE " + table + " SET id = id WHERE id = (SELECT min(id) FROM " + table + ")")
	}
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
	j := streamThenJoin(t, e, "t2", func(o *testOptions) {
		o.CopyChunkRows = 300
		// After the first chunk's snapshot, before its high watermark: the
		// chunk holds the rows as they were.
		e.writeAtChunks(o, map[int][]string{1: {"UPDATE t2 SET v = 'changed' WHERE id = 1", "DELETE FROM t2 WHERE id = 2",
			"INSERT INTO t2 VALUES (5000, 'new', 0)", "UPDATE t2 SET n = -1 WHERE id = 700"}})
	})
	res, err := j.src.CopyTable(context.Background(), j.oid, false)
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
	j := streamThenJoin(t, e, "t2", func(o *testOptions) {
		o.CopyChunkRows = 30
		e.writeAtChunks(o, map[int][]string{
			1: {"UPDATE t2 SET v = 'changed' WHERE id = 5"}, // in the first chunk's window
			2: {"UPDATE t2 SET id = -90 WHERE id = 90"},     // a row of a later range moves to the copied one
		})
	})
	res, err := j.src.CopyTable(context.Background(), j.oid, false)
	require.NoError(t, err)
	require.Equal(t, 2, res.Refetched, "id 5 and id -90")
	j.sink.waitFor("the copy", func() bool { return j.sink.resolved >= res.Ts })
	got := fold(t, j.sink.changes(), "id")
	want := e.tableRows("t2", "id")
	require.Equal(t, want["5"], got["5"])
	require.Equal(t, want["-90"], got["-90"])
	require.Equal(t, want, got)
}

// A truncate in a chunk's window sends the chunk back (its rows may be
// from before the truncate); read again, the table's rows after it are
// copied, none from before.
func TestATruncateInAChunksWindowReadsItAgain(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t2 (id int PRIMARY KEY, v text)")
	e.exec("INSERT INTO t2 SELECT g, 'old' FROM generate_series(1, 50) g")
	j := streamThenJoin(t, e, "t2", func(o *testOptions) {
		e.writeAtChunks(o, map[int][]string{1: {"TRUNCATE t2; INSERT INTO t2 VALUES (7, 'new')"}})
	})
	res, err := j.src.CopyTable(context.Background(), j.oid, false)
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
	sees, err := parseSnapshot("4294967300:4294967310:7,9,4294967301")
	require.NoError(t, err)
	require.Equal(t, snapshotSees{xmin: 4, xmax: 14, xip: []uint32{7, 9, 5}}, sees, "xid8s as 32-bit xids")
	for xid, want := range map[uint32]bool{3: true, 4: true, 6: true, 7: false, 5: false, 13: true, 14: false, 15: false} {
		require.Equal(t, want, sees.visible(xid), "xid %d", xid)
	}
	sees, err = parseSnapshot("5:5:")
	require.NoError(t, err)
	require.Empty(t, sees.xip)
	wrapped := snapshotSees{xmin: math.MaxUint32 - 1, xmax: 3} // the 32-bit xids wrapped in between
	require.True(t, wrapped.visible(math.MaxUint32-5))
	require.True(t, wrapped.visible(math.MaxUint32))
	require.True(t, wrapped.visible(1))
	require.False(t, wrapped.visible(3))
	keys := []string{windowKey([][]byte{[]byte("ab"), []byte("c")}), windowKey([][]byte{[]byte("a"), []byte("bc")})}
	sort.Strings(keys)
	require.NotEqual(t, keys[0], keys[1], "parts are length-prefixed")
	require.False(t, strings.Contains(keys[0], "abc"))
}

// A table that leaves the publication and joins it again missed its
// changes while it was out: the poll tells of it (OnRejoin), and a fresh
// copy empties its subscription first, in the stream's order, then copies
// it, so the rows deleted while it was out are gone too. A quick removal
// and re-adding between two rounds of the poll is found by its new
// membership row.
func TestATableThatLeavesAndJoinsAgainIsCopiedAnew(t *testing.T) {
	for _, quick := range []bool{false, true} {
		t.Run(map[bool]string{false: "AcrossPolls", true: "BetweenPolls"}[quick], func(t *testing.T) {
			e := newSrcEnv(t)
			e.exec("CREATE TABLE t2 (id int PRIMARY KEY, v text)")
			e.exec("INSERT INTO t2 SELECT g, 'v' || g FROM generate_series(1, 100) g")
			rejoined := make(chan pgcodec.Relation, 1)
			j := streamThenJoin(t, e, "t2", func(o *testOptions) {
				o.OnRejoin = func(rel pgcodec.Relation) { rejoined <- rel }
				if quick {
					o.PublicationPollInterval = -1 // the test polls
				}
			})
			res, err := j.src.CopyTable(context.Background(), j.oid, false)
			require.NoError(t, err)
			j.sink.waitFor("the copy", func() bool { return j.sink.resolved >= res.Ts })
			poll := func() {
				conn, err := connect(context.Background(), e.pg.DSN)
				require.NoError(t, err)
				defer conn.Close(context.Background())
				require.NoError(t, j.src.pollPublication(context.Background(), conn))
			}
			if quick {
				poll() // records the membership row
			}
			e.exec("ALTER PUBLICATION only_t1 DROP TABLE t2")
			if !quick {
				testwait.Within(t, time.Minute, "the poll finds t2 gone", func() bool {
					j.src.pub.Lock()
					defer j.src.pub.Unlock()
					return j.src.pub.left[j.oid]
				})
			}
			e.exec("DELETE FROM t2 WHERE id <= 10")
			e.exec("UPDATE t2 SET v = 'while out' WHERE id = 20")
			e.exec("INSERT INTO t2 VALUES (500, 'new while out')")
			e.exec("ALTER PUBLICATION only_t1 ADD TABLE t2")
			if quick {
				poll()
			}
			select {
			case rel := <-rejoined:
				require.Equal(t, "t2", rel.Name)
			case <-time.After(time.Minute):
				t.Fatal("no rejoin told")
			}
			res, err = j.src.CopyTable(context.Background(), j.oid, true)
			require.NoError(t, err)
			j.sink.waitFor("the fresh copy", func() bool { return j.sink.resolved >= res.Ts })
			require.Equal(t, e.tableRows("t2", "id"), fold(t, j.sink.changes(), "id"))
		})
	}
}

// pg_current_snapshot's text comes from the source database: whatever it
// holds, reading it never panics.
func FuzzParseSnapshot(f *testing.F) {
	for _, s := range []string{"5:12:7,9", "5:5:", "", "::", "1:2:x,3", "1:2:4294967301,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, snap string) {
		sees, err := parseSnapshot(snap)
		if err != nil {
			require.ErrorIs(t, err, ErrProtocol)
			return
		}
		require.LessOrEqual(t, len(sees.xip), len(snap))
	})
}

// writeAtChunks makes o's copy hook run statements, on a connection of
// their own, once a copy's n-th chunk is read and before its high
// watermark (in its window, after its snapshot): at[n] (each chunk read
// counts, read again or not).
func (e *srcEnv) writeAtChunks(o *testOptions, at map[int][]string) {
	e.t.Helper()
	writer, err := pgx.Connect(context.Background(), e.pg.DSN)
	require.NoError(e.t, err)
	e.t.Cleanup(func() { writer.Close(context.Background()) })
	chunks := 0
	o.knobs.copyHook = func(uint32, int) {
		chunks++
		for _, q := range at[chunks] {
			_, err := writer.Exec(context.Background(), q)
			require.NoError(e.t, err)
		}
	}
}

// Two windows open on a table, the first of a chunk given up: the core
// closes the first when told (the shell does before the next message) and
// notes a change in the second. Closing the first inside
// the loop over the windows moved the second into its place and left a
// nil at the end of the slice being ranged over, whose dereference
// panicked with the source's lock held and hung the stream (found by a CI
// run of TestACopyWaitsForACommitItsSnapshotCannotSeeYet, where chunks
// sent back pile up windows).
func TestAChangeSkipsAndClosesAGivenUpWindow(t *testing.T) {
	c := newCore(newStreamState(map[uint32]pgcodec.Relation{}), Position{}, 1<<20)
	gone := &copyChunk{id: "gone", st: &copyState{oid: 7}, window: map[string]*touch{}}
	live := &copyChunk{id: "live", st: &copyState{oid: 7}, window: map[string]*touch{}}
	c.st.copyWindows[7] = []*copyChunk{gone, live}
	c.forgetCopies(func(ch *copyChunk) bool { return ch == live }, func(*copyState) bool { return false })
	key := [][]byte{[]byte("1")}
	c.noteCopies(7, pgcodec.Delete, key, &pgcodec.RowChange{Change: pgcodec.Delete})
	require.Equal(t, []*copyChunk{live}, c.st.copyWindows[7], "the given-up window is closed")
	require.Len(t, live.window, 1, "the change is noted in the live window")
	require.True(t, live.window[windowKey(key)].deleted)
	require.Empty(t, gone.window)
}

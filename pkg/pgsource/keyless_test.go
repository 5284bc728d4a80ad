package pgsource

import (
	"context"
	"slices"
	"sort"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// keylessFold applies a keyless table's changes as a subscriber would:
// an update or delete changes one row equal to its old row. It returns
// the rows as "a:b", sorted.
func keylessFold(t *testing.T, changes []pgcodec.RowChange) []string {
	t.Helper()
	var rows []string
	rowOf := func(ds []pgcodec.Datum) string {
		return text(pgcodec.RowChange{Columns: ds}, "a") + ":" + text(pgcodec.RowChange{Columns: ds}, "b")
	}
	remove := func(r string) {
		i := slices.Index(rows, r)
		require.GreaterOrEqual(t, i, 0, "a change of row %s the subscriber does not have", r)
		rows = slices.Delete(rows, i, i+1)
	}
	for _, c := range changes {
		switch c.Change {
		case pgcodec.Truncate:
			rows = nil
		case pgcodec.Insert:
			rows = append(rows, rowOf(c.Columns))
		case pgcodec.Delete:
			remove(rowOf(c.Columns))
		case pgcodec.Update:
			require.NotNil(t, c.From, "a keyless update carries its old row")
			remove(rowOf(c.From))
			rows = append(rows, rowOf(c.Columns))
		default:
			t.Fatalf("a %s of a keyless table", c.Change)
		}
	}
	sort.Strings(rows)
	return rows
}

func (e *srcEnv) keylessRows(table string) []string {
	e.t.Helper()
	rows, err := e.conn.Query(context.Background(), "SELECT a::text || ':' || coalesce(b, '<null>') FROM "+table)
	require.NoError(e.t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(e.t, err)
	sort.Strings(out)
	return out
}

// A table without a key streams: its snapshot, inserts (duplicates
// kept), and under REPLICA IDENTITY FULL updates with the whole old row
// and deletes by every column; folded as a subscriber does, it is the
// source table.
func TestAKeylessTableStreamsItsWholeRows(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE log (a int, b text)")
	e.exec("ALTER TABLE log REPLICA IDENTITY FULL")
	e.exec("INSERT INTO log VALUES (1, 'x'), (1, 'x'), (2, NULL)")
	info, sinks := openAndSubscribe(t, e, e.source(nil), "log")
	require.Empty(t, info.LeftOut)
	sink := sinks["log"]
	sink.waitFor("the snapshot", func() bool { return sink.resolved >= info.SnapshotTs })
	e.exec("INSERT INTO log VALUES (3, 'y'), (3, 'y')")
	e.exec("UPDATE log SET b = 'changed' WHERE ctid = (SELECT ctid FROM log WHERE a = 1 LIMIT 1)")
	e.exec("DELETE FROM log WHERE a = 2")
	e.exec("UPDATE log SET a = 4 WHERE a = 3")
	e.exec("INSERT INTO log VALUES (5, repeat('toasted', 100000))") // a TOASTed value, then an update that leaves it
	e.exec("UPDATE log SET a = 6 WHERE a = 5")
	want := e.keylessRows("log")
	sink.waitFor("the changes", func() bool { return len(sink.rows) == 3+2+1+1+2+1+1 })
	require.Equal(t, want, keylessFold(t, sink.changes()))
}

// A table without a key that joins while streaming is copied by what the
// chunk's snapshot saw (copy_keyless.go): emptied at the low watermark,
// its rows as of the snapshot, then the changes of the transactions the
// snapshot did not see, one that was in progress when it was taken
// included. Folded as a subscriber does, it is the source table: no row
// twice, no change lost, the in-progress update applied to the row the
// chunk wrote.
func TestAKeylessTableThatJoinsIsCopiedByItsSnapshot(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE log (a int, b text)")
	e.exec("ALTER TABLE log REPLICA IDENTITY FULL")
	e.exec("INSERT INTO log SELECT g % 50, 'v' || (g % 50) FROM generate_series(1, 200) g") // every row four times
	inProgress, err := pgx.Connect(context.Background(), e.pg.DSN)
	require.NoError(t, err)
	defer inProgress.Close(context.Background())
	var tx pgx.Tx
	j := streamThenJoin(t, e, "log", func(o *testOptions) {
		e.writeAtChunks(o, map[int][]string{1: {
			"DELETE FROM log WHERE a = 2",
			"INSERT INTO log VALUES (1000, 'new'), (1000, 'new')",
			"UPDATE log SET b = 'later' WHERE a = 3",
		}})
		hook := o.knobs.copyHook
		o.knobs.copyStartHook = func() { // before the low watermark: in progress at the chunk's snapshot
			if tx != nil {
				return
			}
			tx, err = inProgress.Begin(context.Background())
			require.NoError(t, err)
			_, err = tx.Exec(context.Background(), "UPDATE log SET b = 'in progress' WHERE a = 1")
			require.NoError(t, err)
		}
		o.knobs.copyHook = func(oid uint32, n int) {
			require.NoError(t, tx.Commit(context.Background())) // in the window, invisible to the chunk
			hook(oid, n)
		}
	})
	res, err := j.src.CopyTable(context.Background(), j.oid, false)
	require.NoError(t, err)
	j.sink.waitFor("the copy", func() bool { return j.sink.resolved >= res.Ts })
	require.Equal(t, int64(200), res.Rows, "the chunk read the table as its snapshot saw it")
	require.Equal(t, e.keylessRows("log"), keylessFold(t, j.sink.changes()))
}

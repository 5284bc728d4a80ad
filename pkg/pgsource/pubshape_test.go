package pgsource

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/common"
)

// A publication's row filter and column list (PostgreSQL 15) hold for
// what is copied as for what streams: the initial snapshot and the copy
// of a table that joins read the rows the filter keeps and the columns the
// list names, as PostgreSQL's own table synchronisation does. They had
// read every row and every column: rows the publication leaves out
// reached the target, and columns it leaves out made the table's relation
// change (which stops it).
func TestTheRowFilterAndColumnListHoldForCopies(t *testing.T) {
	e := newSrcEnv(t)
	for _, name := range []string{"t1", "t2"} {
		e.exec("CREATE TABLE " + name + " (id int PRIMARY KEY, v text, secret text)")
		e.exec("INSERT INTO " + name + " SELECT g, 'v' || g, 's' || g FROM generate_series(1, 100) g")
	}
	e.exec("CREATE PUBLICATION evens FOR TABLE t1 (id, v) WHERE (id % 2 = 0)")
	src := e.source(func(o *testOptions) { o.Publication = "evens" })
	info, err := src.Open(context.Background())
	require.NoError(t, err)
	require.Len(t, info.Tables, 1)
	require.Len(t, info.Tables[0].Columns, 2, "the column list")
	sink := newRecordingSink(t, info.SnapshotTs-1)
	sub, err := src.Subscribe(common.TableSpan(int64(e.oid("t1"))), info.SnapshotTs-1, sink)
	require.NoError(t, err)
	defer sub.Close()
	require.NoError(t, src.Start())
	sink.waitFor("the snapshot", func() bool { return sink.resolved >= info.SnapshotTs })
	got := fold(t, sink.changes(), "id")
	require.Len(t, got, 50, "the even rows")
	require.Equal(t, map[string]string{"id": "42", "v": "v42"}, got["42"])

	// t2 joins with the same filter and list while streaming.
	e.exec("ALTER PUBLICATION evens ADD TABLE t2 (id, v) WHERE (id % 2 = 0)")
	e.exec("INSERT INTO t2 VALUES (102, 'v102', 's'), (103, 'v103', 's')") // announces it; 103 is filtered out
	var oid uint32
	testwait.Within(t, 60*time.Second, "t2 announced", func() bool {
		src.mu.Lock()
		defer src.mu.Unlock()
		oid = e.oid("t2")
		_, held := src.mu.holds[oid]
		return held
	})
	src.mu.Lock()
	from := src.mu.holds[oid]
	src.mu.Unlock()
	sink2 := newRecordingSink(t, from-1)
	sub2, err := src.Subscribe(common.TableSpan(int64(oid)), from-1, sink2)
	require.NoError(t, err)
	defer sub2.Close()
	res, err := src.CopyTable(context.Background(), oid, false)
	require.NoError(t, err)
	sink2.waitFor("the copy", func() bool { return sink2.resolved >= res.Ts })
	got2 := fold(t, sink2.changes(), "id")
	require.Len(t, got2, 51, "the even rows and 102")
	require.NotContains(t, got2, "103")
	require.Equal(t, map[string]string{"id": "102", "v": "v102"}, got2["102"], "no column the list leaves out")
	require.Equal(t, int64(51), res.Rows)
}

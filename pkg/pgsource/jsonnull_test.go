package pgsource

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// A json or jsonb value of JSON null is the text "null", not SQL NULL, in
// the initial snapshot and in a copy as in the stream: the rows were read
// with pgx's Scan, which makes a JSON null a nil pointer, and the target
// got NULL where the source held 'null'.
func TestAJSONNullStaysJSONNullInCopies(t *testing.T) {
	const rows = "INSERT INTO %s VALUES (1, 'null', 'null'), (2, NULL, NULL), (3, '{}', '[null]')"
	want := map[string]map[string]string{
		"1": {"id": "1", "j": "null", "jb": "null"},
		"2": {"id": "2", "j": "<null>", "jb": "<null>"},
		"3": {"id": "3", "j": "{}", "jb": "[null]"},
	}
	t.Run("snapshot", func(t *testing.T) {
		e := newSrcEnv(t)
		e.exec("CREATE TABLE t1 (id int PRIMARY KEY, j json, jb jsonb)")
		e.exec(fmt.Sprintf(rows, "t1"))
		info, sinks := openAndSubscribe(t, e, e.source(nil), "t1")
		sinks["t1"].waitFor("the snapshot", func() bool { return sinks["t1"].resolved >= info.SnapshotTs })
		require.Equal(t, want, fold(t, sinks["t1"].changes(), "id"))
	})
	t.Run("copy", func(t *testing.T) {
		e := newSrcEnv(t)
		e.exec("CREATE TABLE t2 (id int PRIMARY KEY, j json, jb jsonb)")
		e.exec(fmt.Sprintf(rows, "t2"))
		j := streamThenJoin(t, e, "t2", nil)
		res, err := j.src.CopyTable(context.Background(), j.oid, false)
		require.NoError(t, err)
		j.sink.waitFor("the copy", func() bool { return j.sink.resolved >= res.Ts })
		require.Equal(t, want, fold(t, j.sink.changes(), "id"))
	})
}

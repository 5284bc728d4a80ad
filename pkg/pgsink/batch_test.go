package pgsink

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// texts is a column's argument as a list of values ("<null>" for NULL).
func texts(t *testing.T, arg any) []string {
	t.Helper()
	a, ok := arg.(pgtype.FlatArray[pgtype.Text])
	require.True(t, ok, "%T", arg)
	out := make([]string, len(a))
	for i, v := range a {
		out[i] = "<null>"
		if v.Valid {
			out[i] = v.String
		}
	}
	return out
}

// A batch collapses a table's changes to the last effect per key, then
// queues one delete and one upsert per set of columns present, in the
// order their keys first appeared; an update that left a column
// unchanged goes with the rows that leave it out.
func TestABatchGroupsUpsertsByTheColumnsPresent(t *testing.T) {
	tb := &table{qname: `"public"."t"`, types: map[string]string{"id": "bigint", "n": "integer", "v": "text"},
		order: []string{"id", "n", "v"}, key: []string{"id"}}
	text := func(s string) pgcodec.Datum { return pgcodec.Datum{Kind: pgcodec.Text, Text: []byte(s)} }
	named := func(name string, d pgcodec.Datum) pgcodec.Datum { d.Name = name; return d }
	row := func(ch pgcodec.Change, id, n string, v pgcodec.Datum) pgcodec.RowChange {
		return pgcodec.RowChange{Change: ch, Columns: []pgcodec.Datum{named("id", text(id)), named("n", text(n)), named("v", v)}}
	}
	b := newBatch()
	b.add([]byte("1"), row(pgcodec.Insert, "1", "10", text("a")))
	b.add([]byte("2"), row(pgcodec.Insert, "2", "20", pgcodec.Datum{Kind: pgcodec.Null}))
	b.add([]byte("3"), row(pgcodec.Update, "3", "30", pgcodec.Datum{Kind: pgcodec.Unchanged}))
	b.add([]byte("4"), row(pgcodec.Insert, "4", "40", text("d")))
	b.add([]byte("4"), pgcodec.RowChange{Change: pgcodec.Delete, Columns: []pgcodec.Datum{named("id", text("4"))}})
	b.add([]byte("1"), row(pgcodec.Update, "1", "11", pgcodec.Datum{Kind: pgcodec.Unchanged})) // keeps "a"
	b.add([]byte("5"), pgcodec.RowChange{Change: pgcodec.Insert, Columns: []pgcodec.Datum{
		named("v", text("e")), named("id", text("5")), named("n", text("50"))}}) // another column order
	q := &pgx.Batch{}
	n, err := b.queue(q, tb)
	require.NoError(t, err)
	require.Equal(t, 5, n)
	require.Len(t, q.QueuedQueries, 4)

	del := q.QueuedQueries[0]
	require.Contains(t, del.SQL, "DELETE FROM")
	require.Equal(t, []string{"4"}, texts(t, del.Arguments[0]))

	all := q.QueuedQueries[1]
	require.Contains(t, all.SQL, `INSERT INTO "public"."t" ("id", "n", "v")`)
	require.Equal(t, []string{"1", "2"}, texts(t, all.Arguments[0]))
	require.Equal(t, []string{"11", "20"}, texts(t, all.Arguments[1]))
	require.Equal(t, []string{"a", "<null>"}, texts(t, all.Arguments[2]))

	unchanged := q.QueuedQueries[2]
	require.Contains(t, unchanged.SQL, `INSERT INTO "public"."t" ("id", "n")`)
	require.Equal(t, []string{"3"}, texts(t, unchanged.Arguments[0]))
	require.Equal(t, []string{"30"}, texts(t, unchanged.Arguments[1]))

	reordered := q.QueuedQueries[3]
	require.Contains(t, reordered.SQL, `INSERT INTO "public"."t" ("v", "id", "n")`)
	require.Equal(t, []string{"e"}, texts(t, reordered.Arguments[0]))
	require.Equal(t, []string{"5"}, texts(t, reordered.Arguments[1]))
}

// A delete whose key column is missing or NULL is the data's fault, found
// before the server sees it.
func TestABatchRefusesADeleteWithoutItsKey(t *testing.T) {
	tb := &table{qname: `"public"."t"`, types: map[string]string{"id": "bigint"}, order: []string{"id"}, key: []string{"id"}}
	for name, cols := range map[string][]pgcodec.Datum{
		"missing": nil,
		"null":    {{Name: "id", Kind: pgcodec.Null}},
	} {
		b := newBatch()
		b.add([]byte("1"), pgcodec.RowChange{Change: pgcodec.Delete, Columns: cols})
		_, err := b.queue(&pgx.Batch{}, tb)
		require.ErrorIs(t, err, errBadData, name)
	}
}

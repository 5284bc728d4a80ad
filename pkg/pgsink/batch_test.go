package pgsink

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// parseArray reads a one-dimensional text[] in the binary array format
// as pipeline.textArray writes it ("<null>" for NULL), checking its
// header against what it holds.
func parseArray(t *testing.T, b []byte) []string {
	t.Helper()
	u32 := func() uint32 {
		t.Helper()
		require.GreaterOrEqual(t, len(b), 4)
		v := binary.BigEndian.Uint32(b)
		b = b[4:]
		return v
	}
	require.Equal(t, uint32(1), u32(), "dimensions")
	hasNull := u32()
	require.Equal(t, uint32(oidText), u32(), "element type")
	n := u32()
	require.Equal(t, uint32(1), u32(), "lower bound")
	out := make([]string, 0, n)
	nulls := uint32(0)
	for range n {
		l := u32()
		if l == math.MaxUint32 {
			out = append(out, "<null>")
			nulls = 1
			continue
		}
		require.GreaterOrEqual(t, uint32(len(b)), l)
		out = append(out, string(b[:l]))
		b = b[l:]
	}
	require.Empty(t, b, "bytes after the last element")
	require.Equal(t, nulls, hasNull, "the has-nulls flag")
	return out
}

// columns is a statement's parameters as one list of values per column
// ("<null>" for NULL), whichever form it takes: a text array per column
// (unnest) or the rows' values one after another (VALUES, ncols a row).
func columns(t *testing.T, q pstmt, ncols int) [][]string {
	t.Helper()
	out := make([][]string, ncols)
	if strings.Contains(q.sql, "unnest(") {
		require.Len(t, q.params, ncols)
		require.Equal(t, allBinary, q.formats)
		for i, a := range q.params {
			out[i] = parseArray(t, a)
		}
		return out
	}
	require.Contains(t, q.sql, "::text::")
	require.Nil(t, q.formats, "text")
	require.Zero(t, len(q.params)%ncols)
	for i, v := range q.params {
		s := "<null>"
		if v != nil {
			s = string(v)
		}
		out[i%ncols] = append(out[i%ncols], s)
	}
	return out
}

// textArray writes every value as its bytes, an empty one as empty and
// NULL as NULL (and says it holds one); int8Array writes 8-byte
// big-endian elements.
func TestArraysInTheBinaryFormat(t *testing.T) {
	vals := [][]byte{[]byte(`a"b\c`), []byte("{x,y}"), []byte("NULL"), {}, nil, []byte("é\n")}
	var p pipeline
	arr := p.textArray(len(vals), func(i int) []byte { return vals[i] })
	require.Equal(t, []string{`a"b\c`, "{x,y}", "NULL", "", "<null>", "é\n"}, parseArray(t, arr))
	require.Equal(t, []string{"x", ""}, parseArray(t, p.textArray(2, func(i int) []byte { return [][]byte{[]byte("x"), {}}[i] })))
	ints := p.int8Array(2, func(i int) int64 { return []int64{-1, 1 << 40}[i] })
	require.Equal(t, []byte{0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, oidInt8, 0, 0, 0, 2, 0, 0, 0, 1,
		0, 0, 0, 8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 8, 0, 0, 1, 0, 0, 0, 0, 0}, ints)
	require.Equal(t, []string{`a"b\c`, "{x,y}", "NULL", "", "<null>", "é\n"}, parseArray(t, arr), "what followed left it alone")
}

// A batch collapses a table's changes to the last effect per key, then
// queues one delete and one upsert per set of columns present, in the
// order their keys first appeared; an update that left a column
// unchanged goes with the rows that leave it out. A statement of at most
// valuesMaxRows rows lists them as VALUES, a larger one unnests arrays.
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
	b.add([]byte("6"), row(pgcodec.Insert, "6", "60", text("f")))
	q := &pipeline{}
	n, err := b.queue(q, tb)
	require.NoError(t, err)
	require.Equal(t, 6, n)
	require.Len(t, q.stmts, 4)

	del := q.stmts[0]
	require.Equal(t, `DELETE FROM "public"."t" WHERE ("id") IN (($1::text::bigint))`, del.sql)
	require.Equal(t, [][]string{{"4"}}, columns(t, del, 1))

	all := q.stmts[1] // three rows: unnested
	require.Contains(t, all.sql, `INSERT INTO "public"."t" ("id", "n", "v") SELECT`)
	require.Contains(t, all.sql, "unnest(")
	require.Equal(t, [][]string{{"1", "2", "6"}, {"11", "20", "60"}, {"a", "<null>", "f"}}, columns(t, all, 3))

	unchanged := q.stmts[2] // one row: VALUES
	require.Equal(t, `INSERT INTO "public"."t" ("id", "n") VALUES ($1::text::bigint, $2::text::integer) ON CONFLICT ("id") DO UPDATE SET "n" = EXCLUDED."n"`,
		unchanged.sql)
	require.Equal(t, [][]string{{"3"}, {"30"}}, columns(t, unchanged, 2))

	reordered := q.stmts[3]
	require.Contains(t, reordered.sql, `INSERT INTO "public"."t" ("v", "id", "n") VALUES`)
	require.Equal(t, [][]string{{"e"}, {"5"}, {"50"}}, columns(t, reordered, 3))
}

// Deletes of a composite key: two keys as VALUES rows, three unnested.
func TestABatchDeletesCompositeKeysInEitherForm(t *testing.T) {
	tb := &table{qname: `"public"."c"`, types: map[string]string{"a": "integer", "b": "text"}, order: []string{"a", "b"},
		key: []string{"a", "b"}}
	del := func(keys ...string) pstmt {
		b := newBatch()
		for _, k := range keys {
			b.add([]byte(k), pgcodec.RowChange{Change: pgcodec.Delete, Columns: []pgcodec.Datum{
				{Name: "a", Kind: pgcodec.Text, Text: []byte(k)}, {Name: "b", Kind: pgcodec.Text, Text: []byte("k" + k)}}})
		}
		q := &pipeline{}
		n, err := b.queue(q, tb)
		require.NoError(t, err)
		require.Equal(t, len(keys), n)
		require.Len(t, q.stmts, 1)
		return q.stmts[0]
	}
	two := del("1", "2")
	require.Equal(t, `DELETE FROM "public"."c" WHERE ("a", "b") IN (($1::text::integer, $2::text::text), ($3::text::integer, $4::text::text))`, two.sql)
	require.Equal(t, [][]string{{"1", "2"}, {"k1", "k2"}}, columns(t, two, 2))
	three := del("1", "2", "3")
	require.Contains(t, three.sql, "USING unnest(")
	require.Equal(t, [][]string{{"1", "2", "3"}, {"k1", "k2", "k3"}}, columns(t, three, 2))
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
		_, err := b.queue(&pipeline{}, tb)
		require.ErrorIs(t, err, errBadData, name)
	}
}

// The statement cache of a table tells every statement apart whatever its
// columns are named: a column named like the delete's key or ending in a
// control character does not get another statement's SQL (names hold no
// NUL and are never empty; signatures are names joined by one NUL).
func TestStatementSignaturesNeverCollide(t *testing.T) {
	odd := []string{"\x01delete", "a", "\x01", "\x02"}
	tb := &table{qname: `"public"."odd"`, key: []string{"\x01delete"}, order: odd,
		types: map[string]string{"\x01delete": "text", "a": "text", "\x01": "text", "\x02": "text"}}
	seen := map[string]string{} // SQL -> the statement it was asked for
	queue := func(what string, b *batch) {
		t.Helper()
		q := &pipeline{}
		_, err := b.queue(q, tb)
		require.NoError(t, err)
		for _, qq := range q.stmts {
			if prev, ok := seen[qq.sql]; ok && prev != what {
				t.Fatalf("%s got the SQL of %s: %s", what, prev, qq.sql)
			}
			seen[qq.sql] = what
		}
	}
	cols := func(names ...string) pgcodec.RowChange {
		c := pgcodec.RowChange{Change: pgcodec.Insert}
		for _, n := range names {
			c.Columns = append(c.Columns, pgcodec.Datum{Name: n, Kind: pgcodec.Text, Text: []byte("v")})
		}
		return c
	}
	for _, n := range []int{1, 2, 3} {
		del, up1, up2 := newBatch(), newBatch(), newBatch()
		for i := range n {
			k := []byte{byte('0' + i)}
			del.add(k, pgcodec.RowChange{Change: pgcodec.Delete, Columns: cols("\x01delete").Columns})
			up1.add(k, cols("\x01delete"))      // signature "\x01delete"
			up2.add(k, cols("\x01delete", "a")) // against "a" with "\x01" and "\x02" below
		}
		queue(fmt.Sprintf("delete of %d", n), del)
		queue(fmt.Sprintf("upsert of \\x01delete, %d rows", n), up1)
		queue(fmt.Sprintf("upsert of \\x01delete, a, %d rows", n), up2)
	}
	// Three rows, unnested: the signatures end "a\x00\x01" and "a\x00\x02",
	// as "a" and one or two VALUES rows would with a suffix of one NUL.
	one, two := newBatch(), newBatch()
	for _, k := range []string{"x", "y", "z"} {
		one.add([]byte(k), cols("\x01delete", "a", "\x01"))
		two.add([]byte(k), cols("\x01delete", "a", "\x02"))
	}
	queue("upsert of \\x01delete, a, \\x01", one)
	queue("upsert of \\x01delete, a, \\x02", two)
}

// A table's last statement of each form is used again only for the same
// columns: a one-row upsert that leaves a column unchanged between two
// that do not gets its own statement, and the third the first one's.
func TestALastStatementIsUsedAgainOnlyForItsColumns(t *testing.T) {
	tb := &table{qname: `"public"."t"`, types: map[string]string{"id": "bigint", "v": "text"}, order: []string{"id", "v"},
		key: []string{"id"}}
	one := func(cols ...pgcodec.Datum) pstmt {
		b := newBatch()
		b.add([]byte("1"), pgcodec.RowChange{Change: pgcodec.Update, Columns: cols})
		q := &pipeline{}
		_, err := b.queue(q, tb)
		require.NoError(t, err)
		require.Len(t, q.stmts, 1)
		return q.stmts[0]
	}
	id := pgcodec.Datum{Name: "id", Kind: pgcodec.Text, Text: []byte("1")}
	v := pgcodec.Datum{Name: "v", Kind: pgcodec.Text, Text: []byte("x")}
	all := one(id, v)
	keyOnly := one(id, pgcodec.Datum{Name: "v", Kind: pgcodec.Unchanged})
	require.NotSame(t, all.prep, keyOnly.prep)
	require.Contains(t, keyOnly.sql, "DO NOTHING")
	again := one(id, v)
	require.Same(t, all.prep, again.prep)
	del := newBatch()
	del.add([]byte("1"), pgcodec.RowChange{Change: pgcodec.Delete, Columns: []pgcodec.Datum{id}})
	q := &pipeline{}
	_, err := del.queue(q, tb)
	require.NoError(t, err)
	require.Contains(t, q.stmts[0].sql, "DELETE")
	require.Same(t, all.prep, one(id, v).prep, "a delete of the form has a place of its own")
	tb.forget()
	require.NotSame(t, all.prep, one(id, v).prep, "forgotten with the columns")
}

// A delete of a table whose target lost its key (read again after a
// failure) is refused as a schema change, never dropped.
func TestADeleteWithoutATargetKeyIsASchemaChange(t *testing.T) {
	tb := &table{qname: `"public"."t"`, types: map[string]string{"id": "bigint"}, order: []string{"id"}}
	b := newBatch()
	b.add([]byte("1"), pgcodec.RowChange{Change: pgcodec.Delete, Columns: []pgcodec.Datum{{Name: "id", Kind: pgcodec.Text, Text: []byte("1")}}})
	_, err := b.queue(&pipeline{}, tb)
	require.ErrorIs(t, err, ErrSchemaChange)
}

package replicate

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cdcflow/eventservice/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/testwait"
)

// aType is a column type of the all-types table and a generator of SQL
// literals of it (edge values among them).
type aType struct {
	name string // the column's type
	gen  func(r *rand.Rand) string
}

// pick returns one of vs.
func pick(r *rand.Rand, vs ...string) string { return vs[r.IntN(len(vs))] }

// q quotes s as a string constant.
func q(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func allTypes() []aType {
	num := func(r *rand.Rand) string {
		return pick(r, "'NaN'", "'Infinity'", "'-Infinity'", "0", "-0.0", "1e-300", "123456789012345678901234567890.123456789",
			fmt.Sprintf("%d.%d", r.Int64N(1e12)-5e11, r.IntN(1000)))
	}
	float := func(r *rand.Rand) string {
		return pick(r, "'NaN'", "'Infinity'", "'-Infinity'", "'-0'", "1e308", "2.2250738585072014e-308", "5e-324",
			fmt.Sprintf("%g", r.NormFloat64()*1e6))
	}
	text := func(r *rand.Rand) string {
		return q(pick(r, "", " ", "it's", `back\slash`, "ünïcödé ✓", "tab\there", "nul-free \"quotes\"", "{braces},[]", "null", "NULL",
			fmt.Sprintf("w%d", r.IntN(1000))))
	}
	ts := func(r *rand.Rand) string {
		return pick(r, "'infinity'", "'-infinity'", "'4713-01-01 00:00:00 BC'", "'294276-12-31 23:59:59.999999'", "'1883-11-18 12:03:57'",
			fmt.Sprintf("'%04d-%02d-%02d %02d:%02d:%02d.%06d'", 1+r.IntN(9998), 1+r.IntN(12), 1+r.IntN(28), r.IntN(24), r.IntN(60), r.IntN(60), r.IntN(1e6)))
	}
	return []aType{
		{"smallint", func(r *rand.Rand) string { return pick(r, "-32768", "32767", fmt.Sprint(r.IntN(100))) }},
		{"integer", func(r *rand.Rand) string { return pick(r, "-2147483648", "2147483647", fmt.Sprint(r.Int32())) }},
		{"bigint", func(r *rand.Rand) string {
			return pick(r, "-9223372036854775808", "9223372036854775807", fmt.Sprint(r.Int64()))
		}},
		{"numeric", num},
		{"numeric(12,4)", func(r *rand.Rand) string {
			return pick(r, "'NaN'", "-0.0001", fmt.Sprintf("%d.%04d", r.IntN(1e8), r.IntN(1e4)))
		}},
		{"real", func(r *rand.Rand) string {
			return pick(r, "'NaN'", "'Infinity'", "'-Infinity'", "'-0'", "3.4e38", "1e-45", fmt.Sprintf("%g", float32(r.NormFloat64()*1e3)))
		}},
		{"double precision", float},
		{"money", func(r *rand.Rand) string {
			return pick(r, "-92233720368547758.08", "0", fmt.Sprintf("%d.%02d", r.IntN(1e6), r.IntN(100)))
		}},
		{"text", text},
		{"character varying(12)", func(r *rand.Rand) string { return q(pick(r, "", "a", "twelve chars", "ü")) }},
		{"character(5)", func(r *rand.Rand) string { return q(pick(r, "", "a", "ab ", "fives")) }},
		{"bytea", func(r *rand.Rand) string {
			return pick(r, `'\x'`, `'\x00'`, `'\xdeadbeef'`, fmt.Sprintf(`'\x%08x'`, r.Uint32()))
		}},
		{"boolean", func(r *rand.Rand) string { return pick(r, "true", "false") }},
		{"date", func(r *rand.Rand) string {
			return pick(r, "'infinity'", "'-infinity'", "'4713-01-01 BC'", "'5874897-12-31'", "'2000-02-29'")
		}},
		{"time", func(r *rand.Rand) string { return pick(r, "'00:00'", "'24:00'", "'23:59:59.999999'") }},
		{"time with time zone", func(r *rand.Rand) string { return pick(r, "'00:00+1559'", "'24:00-1559'", "'12:34:56.789+05:30'") }},
		{"timestamp", ts},
		{"timestamp with time zone", func(r *rand.Rand) string {
			return pick(r, "'infinity'", "'-infinity'", "'4713-01-02 00:00:00+00 BC'", "'294276-12-30 23:59:59.999999+00'", "'1883-11-18 12:03:57-04:56:02'",
				fmt.Sprintf("'%04d-%02d-%02d %02d:%02d:%02d.%06d%s'", 1+r.IntN(9998), 1+r.IntN(12), 1+r.IntN(28), r.IntN(24), r.IntN(60), r.IntN(60), r.IntN(1e6),
					pick(r, "+00", "+05:30", "-03:30", "+14")))
		}},
		{"interval", func(r *rand.Rand) string {
			return pick(r, "'-178000000 years'", "'178000000 years'", "'1 mon -1 day 00:00:00.000001'", "'0'", fmt.Sprintf("'%d days %d:%02d'", r.IntN(1000)-500, r.IntN(24), r.IntN(60)))
		}},
		{"uuid", func(r *rand.Rand) string {
			return pick(r, "'00000000-0000-0000-0000-000000000000'", fmt.Sprintf("'%08x-0000-4000-8000-%012x'", r.Uint32(), r.Uint64()&0xffffffffffff))
		}},
		{"json", func(r *rand.Rand) string {
			return q(pick(r, "null", "{}", `{"a" : 1.10, "a": [null, true]}`, `"str"`, "  [ 1 , 2 ]  "))
		}},
		{"jsonb", func(r *rand.Rand) string {
			return q(pick(r, "null", "{}", `{"a": 1.10, "b": [null, true]}`, `"str"`, "1e400"))
		}},
		{"xml", func(r *rand.Rand) string { return q(pick(r, "<a/>", `<a b="c">text &amp; more</a>`, "plain text")) }},
		{"inet", func(r *rand.Rand) string { return q(pick(r, "10.0.0.1", "10.0.0.1/8", "::1", "2001:db8::1/64")) }},
		{"cidr", func(r *rand.Rand) string { return q(pick(r, "10.0.0.0/8", "2001:db8::/32", "192.168.1.1/32")) }},
		{"macaddr", func(r *rand.Rand) string { return q(pick(r, "08:00:2b:01:02:03", "ff:ff:ff:ff:ff:ff")) }},
		{"macaddr8", func(r *rand.Rand) string { return q(pick(r, "08:00:2b:01:02:03:04:05", "00:00:00:ff:fe:00:00:00")) }},
		{"bit(8)", func(r *rand.Rand) string { return fmt.Sprintf("B'%08b'", r.IntN(256)) }},
		{"bit varying", func(r *rand.Rand) string { return pick(r, "B''", "B'1'", fmt.Sprintf("B'%b'", r.IntN(1<<20))) }},
		{"point", func(r *rand.Rand) string { return q(pick(r, "(0,0)", "(-1.5,1e300)", "(NaN,Infinity)")) }},
		{"line", func(r *rand.Rand) string { return q(pick(r, "{1,-1,0}", "{0,1,2.5}")) }},
		{"lseg", func(r *rand.Rand) string { return q("[(0,0),(1,1)]") }},
		{"box", func(r *rand.Rand) string { return q(pick(r, "(1,1),(0,0)", "(2,3),(-1,-2)")) }},
		{"path", func(r *rand.Rand) string { return q(pick(r, "[(0,0),(1,1),(2,0)]", "((0,0),(1,1))")) }},
		{"polygon", func(r *rand.Rand) string { return q("((0,0),(1,1),(2,0))") }},
		{"circle", func(r *rand.Rand) string { return q(pick(r, "<(0,0),1>", "<(1.5,-2),0.25>")) }},
		{"tsvector", func(r *rand.Rand) string { return q(pick(r, "", "a fat:2 cat:1A", "'it''s':3")) }},
		{"tsquery", func(r *rand.Rand) string { return q(pick(r, "fat & cat", "!a | (b <-> c)")) }},
		{"int4range", func(r *rand.Rand) string { return q(pick(r, "empty", "[1,10)", "(,5]", "[3,)")) }},
		{"numrange", func(r *rand.Rand) string { return q(pick(r, "empty", "[1.5,2.25]", "(,)")) }},
		{"tstzrange", func(r *rand.Rand) string {
			return q(pick(r, "empty", "[2026-01-01 00:00+00,infinity)", "(-infinity,2000-01-01 12:00+05:30]"))
		}},
		{"daterange", func(r *rand.Rand) string { return q(pick(r, "empty", "[2026-01-01,2026-12-31]", "[,infinity)")) }},
		{"int4multirange", func(r *rand.Rand) string { return q(pick(r, "{}", "{[1,3),[5,8)}", "{(,0],[10,)}")) }},
		{"integer[]", func(r *rand.Rand) string {
			return q(pick(r, "{}", "{1,NULL,3}", "{{1,2},{3,4}}", "[2:3]={7,8}", "[0:1][1:2]={{1,2},{3,4}}", "{{{1}},{{2}}}"))
		}},
		{"text[]", func(r *rand.Rand) string {
			return q(pick(r, "{}", `{"",NULL,"NULL","a,b","q\"uote","back\\slash"}`, `{{a,b},{c,d}}`))
		}},
		{"oid", func(r *rand.Rand) string { return pick(r, "0", "4294967295", fmt.Sprint(r.Uint32())) }},
		{"pg_lsn", func(r *rand.Rand) string {
			return q(pick(r, "0/0", "FFFFFFFF/FFFFFFFF", fmt.Sprintf("%X/%X", r.Uint32(), r.Uint32())))
		}},
		{"mood", func(r *rand.Rand) string { return q(pick(r, "sad", "ok", "happy")) }},
		{"posnum", func(r *rand.Rand) string { return pick(r, "0.01", "99999999.99") }},
		{"pair", func(r *rand.Rand) string { return pick(r, "ROW(1, 'a,b')", "ROW(NULL, NULL)", `ROW(-1, 'q"uote')`) }},
		{"pair[]", func(r *rand.Rand) string { return "ARRAY[ROW(1, 'x')::pair, NULL]" }},
		// Extensions' types, which the target has too.
		{"hstore", func(r *rand.Rand) string { return q(pick(r, "", "a=>1, b=>NULL", `"k y"=>"v,x", "q\"uote"=>""`)) }},
		{"citext", func(r *rand.Rand) string { return q(pick(r, "", "MiXeD", "mixed")) }},
		{"ltree", func(r *rand.Rand) string { return q(pick(r, "", "top", "a.b_c.d1")) }},
		{"cube", func(r *rand.Rand) string { return q(pick(r, "1", "(0.5)", "(1, 2),(3, 4)")) }},
	}
}

// Every value of every type a table can commonly hold reaches the target
// as the same value, whether the initial snapshot copied it or the stream
// carried it (an insert, then an update of every column): random rows of
// each type, edge values among them (NaN, infinities, -0, BC dates, JSON
// null, arrays of several dimensions and lower bounds, ranges and
// multiranges, char padding, a created enum, domain and composite, the
// types of four extensions the target has too), are
// compared column by column by value (IS NOT DISTINCT FROM, or the text
// of a type without equality, json's), never by a checksum of text.
// The seed is fixed, so a failure replays.
func TestEveryValueOfEveryTypeArrivesExact(t *testing.T) {
	// Two servers configured unlike each other and unlike the defaults, in
	// every setting a value's text depends on: money's lc_monetary (ja_JP
	// has no fractional digits, de_DE two and a decimal comma), the time
	// zone, DateStyle, IntervalStyle, float digits and bytea's output.
	p := newPairWith(t, pgtest.Options{Locales: []string{"ja_JP.UTF-8"}, Settings: []string{"lc_monetary=ja_JP.UTF-8",
		"TimeZone=America/New_York", "DateStyle=SQL,DMY", "IntervalStyle=sql_standard", "extra_float_digits=0", "bytea_output=escape"}},
		pgtest.Options{Locales: []string{"de_DE.UTF-8"}, Settings: []string{"lc_monetary=de_DE.UTF-8",
			"TimeZone=Asia/Kolkata", "DateStyle=German", "IntervalStyle=iso_8601", "extra_float_digits=1", "bytea_output=hex"}})
	for _, s := range []struct {
		srv  *pgtest.Server
		want string
	}{{p.src, "￥1,234"}, {p.dst, "1.234,00 €"}} {
		out, err := s.srv.Client("psql", "-Atc", "SELECT 1234::money")
		require.NoError(t, err, string(out))
		require.Equal(t, s.want, strings.TrimSpace(string(out)), "the server's own lc_monetary")
	}
	types := allTypes()
	for _, s := range []string{"CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')", "CREATE DOMAIN posnum AS numeric(10,2) CHECK (VALUE > 0)",
		"CREATE TYPE pair AS (n int, s text)"} {
		p.exec(s)
	}
	for _, ext := range []string{"hstore", "citext", "ltree", "cube"} {
		p.exec("CREATE EXTENSION " + ext)
		p.targetExec("CREATE EXTENSION " + ext) // the target has them: their columns are of the type itself
	}
	cols := []string{"id int PRIMARY KEY"}
	for i, ty := range types {
		cols = append(cols, fmt.Sprintf("c%d %s", i, ty.name))
	}
	p.exec("CREATE TABLE alltypes (" + strings.Join(cols, ", ") + ")")
	r := rand.New(rand.NewPCG(58, 1))
	row := func(id int) string {
		vals := []string{fmt.Sprint(id)}
		for _, ty := range types {
			if r.IntN(8) == 0 {
				vals = append(vals, "NULL")
			} else {
				vals = append(vals, "("+ty.gen(r)+")::"+ty.name)
			}
		}
		return "(" + strings.Join(vals, ", ") + ")"
	}
	const n = 40
	var snap []string
	for id := 1; id <= n; id++ {
		snap = append(snap, row(id))
	}
	p.exec("INSERT INTO alltypes VALUES " + strings.Join(snap, ", "))
	stop, stderr := p.serve(p.config())
	defer func() { _ = stop() }()
	p.waitEqual("the snapshot of every type")
	p.requireSameValues(types, n, "the snapshot")
	var extCols []string
	for i, ty := range types {
		if slices.Contains([]string{"hstore", "citext", "ltree", "cube"}, ty.name) {
			extCols = append(extCols, fmt.Sprintf("c%d", i))
		}
	}
	require.Equal(t, []string{"hstore", "citext", "ltree", "cube"}, p.targetQuery(`SELECT format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = 'public.alltypes'::regclass AND attname IN ('`+strings.Join(extCols, "', '")+`') ORDER BY attnum`), "the extensions' types themselves")

	var streamed []string
	for id := n + 1; id <= 2*n; id++ {
		streamed = append(streamed, row(id))
	}
	p.exec("INSERT INTO alltypes VALUES " + strings.Join(streamed, ", "))
	for id := 1; id <= 2*n; id += 3 { // every column of some rows, both paths'
		set := make([]string, len(types))
		for i, ty := range types {
			set[i] = fmt.Sprintf("c%d = (%s)::%s", i, ty.gen(r), ty.name)
		}
		p.exec(fmt.Sprintf("UPDATE alltypes SET %s WHERE id = %d", strings.Join(set, ", "), id))
	}
	testwait.Within(t, 2*time.Minute, "the streamed rows", func() bool { return p.targetCountOrNone("public.alltypes") == 2*n })
	p.waitEqual("the stream of every type")
	p.requireSameValues(types, 2*n, "the stream")
	require.NoError(t, stop(), stderr.String())
}

// requireSameValues copies the target's alltypes into the source (as the
// text of each value under the fixed session formats, read back by the
// source's own input functions) and requires every column of every row
// equal by value.
func (p *pair) requireSameValues(types []aType, want int, what string) {
	p.t.Helper()
	ctx := context.Background()
	dst, err := pgx.Connect(ctx, p.dst.DSN)
	require.NoError(p.t, err)
	defer dst.Close(ctx)
	for _, c := range []*pgx.Conn{dst, p.conn} {
		for k, v := range map[string]string{"DateStyle": "ISO, YMD", "IntervalStyle": "postgres", "TimeZone": "UTC", "extra_float_digits": "3",
			"bytea_output": "hex", "lc_monetary": "C"} {
			_, err := c.Exec(ctx, "SELECT set_config($1, $2, false)", k, v)
			require.NoError(p.t, err)
		}
	}
	names := make([]string, len(types))
	for i := range types {
		names[i] = fmt.Sprintf("c%d::text", i)
	}
	rows, err := dst.Query(ctx, "SELECT id, "+strings.Join(names, ", ")+" FROM alltypes ORDER BY id")
	require.NoError(p.t, err)
	var copied [][]*string
	for rows.Next() {
		vals := make([]*string, len(types)+1)
		dstv := make([]any, len(vals))
		for i := range vals {
			dstv[i] = &vals[i]
		}
		var id int
		dstv[0] = &id
		require.NoError(p.t, rows.Scan(dstv...))
		s := fmt.Sprint(id)
		vals[0] = &s
		copied = append(copied, vals)
	}
	require.NoError(p.t, rows.Err())
	require.Len(p.t, copied, want, "%s: the target's rows", what)
	p.exec("DROP TABLE IF EXISTS target_copy")
	p.exec("CREATE TABLE target_copy (LIKE alltypes)")
	for _, vals := range copied {
		args := make([]any, len(vals))
		ph := make([]string, len(vals))
		for i, v := range vals {
			if v != nil {
				args[i] = *v
			}
			ph[i] = fmt.Sprintf("$%d", i+1)
			if i > 0 {
				ph[i] += "::text::" + types[i-1].name
			} else {
				ph[i] += "::text::int"
			}
		}
		p.exec("INSERT INTO target_copy VALUES ("+strings.Join(ph, ", ")+")", args...)
	}
	for i, ty := range types {
		// The text under the fixed formats (exact: -0 is not 0, 1.10 not
		// 1.1), and the type's equality where it has one that is not an
		// area's (json, xml and point have none; box and circle compare
		// areas).
		cmp := fmt.Sprintf("s.c%d::text IS NOT DISTINCT FROM t.c%d::text", i, i)
		_, err := p.conn.Exec(ctx, fmt.Sprintf("SELECT NULL::%s IS NOT DISTINCT FROM NULL::%s", ty.name, ty.name))
		if err == nil && !slices.Contains([]string{"point", "line", "lseg", "box", "path", "polygon", "circle"}, ty.name) {
			cmp += fmt.Sprintf(" AND s.c%d IS NOT DISTINCT FROM t.c%d", i, i)
		}
		var bad []string
		rows, err := p.conn.Query(ctx, fmt.Sprintf(`SELECT coalesce(s.id, t.id)::text || ': ' || coalesce(s.c%d::text, '<null>') || ' / ' || coalesce(t.c%d::text, '<null>')
FROM alltypes s FULL JOIN target_copy t USING (id) WHERE s.id IS NULL OR t.id IS NULL OR NOT (%s)`, i, i, cmp))
		require.NoError(p.t, err)
		bad, err = pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(p.t, err)
		require.Empty(p.t, bad, "%s: column c%d of type %s: source / target", what, i, ty.name)
	}
}

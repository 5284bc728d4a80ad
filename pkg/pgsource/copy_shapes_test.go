package pgsource

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

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
			j := streamThenJoin(t, e, "t2", func(o *testOptions) { e.writeAtChunks(o, map[int][]string{1: {tc.upd, tc.del}}) })
			res, err := j.src.CopyTable(context.Background(), j.oid, false)
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
	j := streamThenJoin(t, e, "t2", func(o *testOptions) {
		o.CopyChunkRows = 300
		o.knobs.copyHook = func(uint32, int) {
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
	res, err := j.src.CopyTable(context.Background(), j.oid, false)
	require.NoError(t, err)
	require.NoError(t, <-committed)
	require.Equal(t, int64(1000), res.Rows, "every row copied")
	j.sink.waitFor("the copy", func() bool { return j.sink.resolved >= res.Ts })
	require.Len(t, fold(t, j.sink.changes(), "id"), 1000)
}

// A table dropped between two chunks ends its copy with ErrTableGone
// (serve then takes it off its list and copies the next): resolving a
// dropped OID's name gives the number, and the copy had gone round for
// good on the LOCK that number made fail.
func TestADroppedTableEndsItsCopy(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t2 (id int PRIMARY KEY, v text)")
	e.exec("INSERT INTO t2 SELECT g, 'v' || g FROM generate_series(1, 1000) g")
	j := streamThenJoin(t, e, "t2", func(o *testOptions) {
		o.CopyChunkRows = 300
		e.writeAtChunks(o, map[int][]string{1: {"DROP TABLE t2"}})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := j.src.CopyTable(ctx, j.oid, false)
	require.ErrorIs(t, err, ErrTableGone, "%+v", res)
}

// PRIMARY KEY (id) INCLUDE (v): the key is (id), as pgoutput marks it; the
// catalog had taken the INCLUDE column for a key column too, and the
// copy's relation then changed the table's key (which stops it).
func TestAnIncludedColumnIsNotPartOfTheKey(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t2 (id int, v text NOT NULL, PRIMARY KEY (id) INCLUDE (v))")
	e.exec("INSERT INTO t2 SELECT g, 'v' || g FROM generate_series(1, 100) g")
	j := streamThenJoin(t, e, "t2", func(o *testOptions) {
		e.writeAtChunks(o, map[int][]string{1: {"UPDATE t2 SET v = 'changed' WHERE id = 1", "DELETE FROM t2 WHERE id = 2"}})
	})
	res, err := j.src.CopyTable(context.Background(), j.oid, false)
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
	res, err := j.src.CopyTable(context.Background(), j.oid, false)
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
	res, err := j.src.CopyTable(context.Background(), j.oid, false)
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
	j := streamThenJoin(t, e, "t2", func(o *testOptions) {
		o.CopyChunkRows = 30
		e.writeAtChunks(o, map[int][]string{1: {"ALTER TABLE t2 DROP CONSTRAINT t2_pkey, ADD PRIMARY KEY (id, b)"}})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := j.src.CopyTable(ctx, j.oid, false)
	require.NoError(t, err)
	require.GreaterOrEqual(t, res.Rows, int64(100), "every row, some twice")
}

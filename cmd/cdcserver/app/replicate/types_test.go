package replicate

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/pgsource"
)

// targetQuery runs one query on the target and returns its rows, each as
// its columns' text joined by "|".
func (p *pair) targetQuery(sql string) []string {
	p.t.Helper()
	conn, err := pgx.Connect(context.Background(), p.dst.DSN)
	require.NoError(p.t, err)
	defer conn.Close(context.Background())
	rows, err := conn.Query(context.Background(), sql, pgx.QueryExecModeSimpleProtocol)
	require.NoError(p.t, err, sql)
	defer rows.Close()
	var out []string
	for rows.Next() {
		vals, err := rows.Values()
		require.NoError(p.t, err)
		parts := make([]string, len(vals))
		for i, v := range vals {
			if s, ok := v.(string); ok {
				parts[i] = s
			} else {
				parts[i] = "?"
			}
		}
		out = append(out, strings.Join(parts, "|"))
	}
	require.NoError(p.t, rows.Err())
	return out
}

// What a source's own schema holds beyond built-in types and plain
// tables reaches the target whole: columns of created types (an enum, a
// composite in another schema, a domain with a constraint, arrays of
// them) are created as themselves where the target has the type (the enum
// the user made there) and as their base types where it has not, with the
// same text; a table the user created first on the target keeps its own;
// a stored generated column, whose values PostgreSQL 15 does not publish,
// is a generated column of the target with the source's expression (the
// target computes it, and compare checks its values), at the snapshot and
// for a table created while running; a
// partitioned table arrives as its partitions, a row that moves between
// them and a partition truncated included; and a column added with a
// constant default gives the rows that were there its value, which no
// row change carries.
func TestServeReplicatesCreatedTypesDefaultsAndPartitions(t *testing.T) {
	p := newPair(t)
	p.exec("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
	p.exec(`CREATE SCHEMA "Sales"`)
	p.exec(`CREATE TYPE "Sales".pt AS (x int, y text)`)
	p.exec("CREATE DOMAIN posnum AS numeric(10,2) CHECK (VALUE > 0)")
	p.exec(`CREATE TABLE typed (id int PRIMARY KEY, m mood, moods mood[], c "Sales".pt, p posnum, ps posnum[])`)
	p.exec(`INSERT INTO typed VALUES (1, 'happy', '{sad,ok}', ROW(1, 'a,b'), 1.5, '{2.25}'), (2, NULL, NULL, NULL, NULL, NULL)`)
	p.exec("CREATE TABLE keeps (id int PRIMARY KEY, m mood)")
	p.exec("INSERT INTO keeps VALUES (1, 'sad')")
	p.exec("CREATE TABLE gen (id int PRIMARY KEY, a int, twice int GENERATED ALWAYS AS (a * 2) STORED)")
	p.exec("INSERT INTO gen (id, a) SELECT g, g FROM generate_series(1, 10) g")
	p.exec("CREATE TABLE parted (id int, region text, v text, PRIMARY KEY (id, region)) PARTITION BY LIST (region)")
	p.exec("CREATE TABLE parted_eu PARTITION OF parted FOR VALUES IN ('eu')")
	p.exec("CREATE TABLE parted_us PARTITION OF parted FOR VALUES IN ('us')")
	p.exec("INSERT INTO parted VALUES (1, 'eu', 'a'), (2, 'us', 'b')")
	// The user's own table on the target, with the type the source has.
	dst, err := pgx.Connect(context.Background(), p.dst.DSN)
	require.NoError(t, err)
	for _, q := range []string{"CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')", "CREATE TABLE keeps (id int PRIMARY KEY, m mood)"} {
		_, err := dst.Exec(context.Background(), q)
		require.NoError(t, err, q)
	}
	require.NoError(t, dst.Close(context.Background()))

	stop, stderr := p.serve(p.config())
	p.waitEqual("the snapshot of created types, a generated column and a partitioned table")
	require.Equal(t, []string{"m|mood", "moods|mood[]", "c|text", "p|numeric(10,2)", "ps|numeric(10,2)[]", "keeps.m|mood"}, append(
		p.targetQuery(`SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = 'public.typed'::regclass AND attnum > 1 ORDER BY attnum`),
		p.targetQuery(`SELECT 'keeps.' || attname, format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = 'public.keeps'::regclass AND attname = 'm'`)...),
		"a created type the target has as itself (the user made mood there), the others as their base types; the user's table keeps its own")
	require.Equal(t, []string{"gen", "keeps", "parted_eu", "parted_us", "typed"},
		p.targetQuery("SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind = 'r' ORDER BY 1"),
		"the partitions are tables in the target")
	require.Equal(t, []string{"twice|s|(a * 2)"}, p.targetQuery(`SELECT attname, attgenerated::text, pg_get_expr(adbin, adrelid)
FROM pg_attribute JOIN pg_attrdef ON adrelid = attrelid AND adnum = attnum WHERE attrelid = 'public.gen'::regclass`),
		"the generated column, with the source's expression")

	p.exec(`UPDATE typed SET m = 'ok', moods = '{happy}', c = ROW(2, 'q"uote'), p = 9.99, ps = '{1,2}' WHERE id = 2`)
	p.exec("UPDATE keeps SET m = 'happy'")
	p.exec("INSERT INTO gen (id, a) VALUES (11, 11)")
	p.exec("CREATE TABLE gen_later (id int PRIMARY KEY, a text, up text GENERATED ALWAYS AS (upper(a) || ';') STORED)")
	p.exec("INSERT INTO gen_later (id, a) VALUES (1, 'x')")
	p.exec("UPDATE parted SET region = 'us' WHERE id = 1") // moves between partitions
	p.exec("INSERT INTO parted VALUES (3, 'eu', 'c'), (4, 'eu', 'd')")
	p.exec("TRUNCATE parted_eu") // old partitions are truncated: the target's must be too
	p.waitEqual("changes of created types, a generated column and a partitioned table")
	testwait.Within(t, 2*time.Minute, "the table created with a generated column joins", func() bool {
		return p.targetCountOrNone("public.gen_later") == 1
	})
	require.Equal(t, []string{"X;"}, p.targetQuery("SELECT up FROM gen_later"), "computed by the target")

	p.exec(`ALTER TABLE typed ADD COLUMN s mood DEFAULT 'ok', ADD COLUMN note text DEFAULT E'it''s a \\ back', ADD COLUMN n int DEFAULT 42, ADD COLUMN plain int, ADD COLUMN c2 "Sales".pt DEFAULT ROW(7, 'x')`)
	p.exec("INSERT INTO typed (id) VALUES (3)")
	p.waitEqual("columns added with constant defaults")
	require.Equal(t, []string{`1|ok|it's a \ back|(7,x)`, `2|ok|it's a \ back|(7,x)`, `3|ok|it's a \ back|(7,x)`},
		p.targetQuery("SELECT id::text, s::text, note, c2 FROM typed ORDER BY id"), "the rows that were there hold the defaults")
	require.Equal(t, []string{"s|mood", "c2|text"}, p.targetQuery(`SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute
WHERE attrelid = 'public.typed'::regclass AND attname IN ('s', 'c2') ORDER BY attnum`), "an added column's type is chosen alike")
	require.Equal(t, []string{"0"}, p.targetQuery("SELECT count(*)::text FROM pg_attrdef WHERE adrelid = 'public.typed'::regclass"),
		"the target's columns keep no default: every value comes from the source")
	require.NotContains(t, stderr.String(), "rewrote the table")

	// A column whose default made PostgreSQL rewrite the table (a domain
	// with a constraint) has its values written into the rows with no
	// change to stream: serve says so, naming the table and the column.
	p.exec("ALTER TABLE gen ADD COLUMN d posnum DEFAULT 3.5")
	p.exec("INSERT INTO gen (id, a) VALUES (12, 12)")
	testwait.For(t, "the warning naming a rewrite whose values cannot be streamed", func() bool {
		return strings.Contains(stderr.String(), "rewrote the table") && strings.Contains(stderr.String(), "[column=d]")
	})
	require.NoError(t, stop(), stderr.String())
	require.NotContains(t, stderr.String(), "ERROR")
}

// Values travel as text, in the formats of the session that prints them.
// A source whose server prints dates day first, times in a zone whose
// abbreviation is ambiguous, floats rounded and intervals in the SQL
// standard's style, and a target that reads dates month first, still
// agree on every value: both ends set their sessions' formats
// (pgcodec.TextFormatParams), the snapshot and the stream alike, and so
// does compare.
func TestServeReadsValuesTheSameWhateverTheServersFormats(t *testing.T) {
	p := newPair(t)
	for _, q := range []string{"ALTER SYSTEM SET datestyle = 'SQL, DMY'", "ALTER SYSTEM SET timezone = 'Asia/Kolkata'",
		"ALTER SYSTEM SET extra_float_digits = 0", "ALTER SYSTEM SET intervalstyle = 'sql_standard'", "SELECT pg_reload_conf()"} {
		p.exec(q)
	}
	dst, err := pgx.Connect(context.Background(), p.dst.DSN)
	require.NoError(t, err)
	for _, q := range []string{"ALTER SYSTEM SET datestyle = 'SQL, MDY'", "ALTER SYSTEM SET timezone = 'America/New_York'", "SELECT pg_reload_conf()"} {
		_, err := dst.Exec(context.Background(), q)
		require.NoError(t, err, q)
	}
	require.NoError(t, dst.Close(context.Background()))
	// A new connection takes the reloaded settings.
	conn, err := pgx.Connect(context.Background(), p.src.DSN)
	require.NoError(t, err)
	var style string
	require.NoError(t, conn.QueryRow(context.Background(), "SHOW datestyle").Scan(&style))
	require.NoError(t, conn.Close(context.Background()))
	require.Equal(t, "SQL, DMY", style)

	const row = `(%d, '2026-03-04', '2026-03-04 05:06:07.123', '2026-03-04 05:06:07.5+00', 0.1, 1.1, '-1 year 2 days -03:00', 12.34)`
	p.exec("CREATE TABLE fmt (id int PRIMARY KEY, d date, ts timestamp, tz timestamptz, f float8, r real, i interval, m money)")
	p.exec("INSERT INTO fmt VALUES " + fmt.Sprintf(row, 1))
	stop, stderr := p.serve(p.config())
	p.waitEqual("the snapshot")
	p.exec("INSERT INTO fmt VALUES " + fmt.Sprintf(row, 2))
	p.waitEqual("the stream")
	want := "2026-03-04|2026-03-04 05:06:07.123|2026-03-04 05:06:07.500|0.1|1.1|-1 years +2 days -03:00:00|12.34"
	require.Equal(t, []string{want, want}, p.targetQuery(`SELECT to_char(d, 'YYYY-MM-DD') || '|' || to_char(ts, 'YYYY-MM-DD HH24:MI:SS.MS')
  || '|' || to_char(tz AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS') || '|' || f::text || '|' || r::text || '|' || i::text
  || '|' || m::numeric::text FROM fmt ORDER BY id`), "the target's own formats print it; the values are the source's")
	require.NoError(t, stop(), stderr.String())
}

// Without the DDL capture (--no-ddl-capture, or a role that is not a
// superuser), a table dropped and created again under its name while
// serve runs is a new table to the stream (a new OID), and its target
// table holds the dropped one's rows: the new table stops, saying so,
// instead of mixing its rows into them; the other tables go on. A
// restart, to which the dropped table is not published, empties the
// target table for the new one, and the new one arrives whole.
func TestATableCreatedAgainUnderItsNameStops(t *testing.T) {
	p := newPair(t)
	p.exec("CREATE TABLE kept (id int PRIMARY KEY)")
	p.exec("CREATE TABLE again (id int PRIMARY KEY, v text)")
	p.exec("INSERT INTO again VALUES (1, 'old'), (2, 'old')")
	cfg := p.config()
	cfg.NoDDLCapture = true
	stop, stderr := p.serve(cfg)
	p.waitEqual("the snapshot")
	testwait.For(t, "the first table's checkpoint and the snapshot's completion recorded", func() bool {
		return len(p.targetQuery("SELECT dispatcher FROM cdcflow.checkpoints WHERE target = '\"public\".\"again\"'")) == 1 &&
			len(p.targetQuery("SELECT value FROM cdcflow.state WHERE key = 'snapshot-done:cdcflow' AND value <> ''")) == 1
	})
	p.exec("DROP TABLE again")
	p.exec("CREATE TABLE again (id int PRIMARY KEY, v text)")
	p.exec("INSERT INTO again VALUES (3, 'new')")
	testwait.For(t, "the new table stopping", func() bool { return strings.Contains(stderr.String(), "holds the rows of source table") })
	p.exec("INSERT INTO kept VALUES (1)")
	testwait.For(t, "the other tables going on", func() bool { return len(p.targetQuery("SELECT id::text FROM kept")) == 1 })
	require.Equal(t, []string{"1|old", "2|old"}, p.targetQuery("SELECT id::text, v FROM again ORDER BY id"), "nothing mixed in")
	require.NoError(t, stop(), stderr.String())

	// At the next start the dropped table is not published: its target
	// table is emptied for the new one, which replays from its start.
	p.exec("INSERT INTO again VALUES (4, 'while down')")
	stop, stderr = p.serve(cfg)
	p.waitEqual("after a restart")
	require.Equal(t, []string{"3|new", "4|while down"}, p.targetQuery("SELECT id::text, v FROM again ORDER BY id"))
	require.Contains(t, stderr.String(), "emptied for the table of its name now")
	require.NoError(t, stop(), stderr.String())
}

// Slot names are the server's, not a database's: a changefeed of another
// database that took serve's default slot name keeps its slot. serve
// refuses at start (exit 2) instead of taking that slot over or dropping
// it as an unfinished start of its own.
func TestServeLeavesAnotherDatabasesSlotAlone(t *testing.T) {
	p := newPair(t)
	p.exec("CREATE TABLE t (id int PRIMARY KEY)")
	p.exec("CREATE DATABASE other")
	other, err := pgx.Connect(context.Background(), p.src.DSNFor("other"))
	require.NoError(t, err)
	defer other.Close(context.Background())
	_, err = other.Exec(context.Background(), "SELECT pg_create_logical_replication_slot('cdcflow', 'pgoutput')")
	require.NoError(t, err)
	slotOf := func() string {
		var db string
		require.NoError(t, p.conn.QueryRow(context.Background(), "SELECT database FROM pg_replication_slots WHERE slot_name = 'cdcflow'").Scan(&db))
		return db
	}
	require.Equal(t, "other", slotOf())

	err = p.runOnce(p.config())
	require.ErrorIs(t, err, ErrSetup)
	require.ErrorIs(t, err, pgsource.ErrForeignSlot)
	require.ErrorContains(t, err, "database other")
	require.Equal(t, "other", slotOf(), "the other database's slot is still there")
	var active bool
	require.NoError(t, p.conn.QueryRow(context.Background(), "SELECT active FROM pg_replication_slots WHERE slot_name = 'cdcflow'").Scan(&active))
	require.False(t, active)
}

package replicate

import (
	"bytes"
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/pgtest"
)

// compareOnce runs compare once and returns its error and report.
func (p *pair) compareOnce() (string, error) {
	var out bytes.Buffer
	err := Compare(context.Background(), p.src.DSN, p.dst.DSN, "cdcflow", &out)
	return out.String(), err
}

// compare is right both ways: it finds equal the target of a changefeed
// whose publication has a row filter (it counted the source's unfiltered
// rows) and a column list (it asked the target for a column the list
// leaves out), with the source and the target in different time zones
// and date styles and values at the edges of their types; and it finds
// different a target whose json null became SQL NULL, one missing a
// filtered-in row, and one whose generated column the target computes
// differently.
func TestCompareIsRightBothWays(t *testing.T) {
	p := &pair{t: t,
		src: pgtest.StartWith(t, pgtest.Options{Logical: true, Settings: []string{"timezone=America/New_York", "datestyle=SQL,DMY"}}),
		dst: pgtest.StartWith(t, pgtest.Options{Settings: []string{"timezone=Asia/Kolkata", "datestyle=German,DMY", "extra_float_digits=0"}})}
	conn, err := pgx.Connect(context.Background(), p.src.DSN)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	p.conn = conn
	p.exec("CREATE TABLE filt (id int PRIMARY KEY, v int)")
	p.exec("INSERT INTO filt SELECT g, g FROM generate_series(1, 10) g")
	p.exec("CREATE TABLE listed (id int PRIMARY KEY, a text, secret text)")
	p.exec("INSERT INTO listed VALUES (1, 'a', 's')")
	p.exec(`CREATE TABLE edge (id int PRIMARY KEY, ts timestamptz, t timestamp, d date, n numeric, f float8, r real, j jsonb, js json,
		iv interval, m money, b bytea, c char(4), twice numeric GENERATED ALWAYS AS (n * 2) STORED)`)
	p.exec(`INSERT INTO edge VALUES
		(1, 'infinity', '-infinity', 'infinity', 'NaN', 'NaN', '-0', 'null', 'null', '1 year 2 mons -3 days 04:05:06.789', 12.34, '\x00ff', 'ab', DEFAULT),
		(2, '1883-11-18 12:03:57-04:56:02', '0044-03-15 12:00:00 BC', '4713-01-01 BC', 'Infinity', '-0', 'Infinity', '{"a": 1.10, "b": [null]}', '{"a" : 1.10}', '-178000000 years', -0.01, '', NULL, DEFAULT),
		(3, '2038-01-19 03:14:08+00', '294276-12-31 23:59:59', '2026-12-07', 1e-1000, 1e308, 3.4e38, '[]', ' [ ] ', '0', 0, NULL, 'x', DEFAULT),
		(4, NULL, NULL, NULL, -1.5e100, 2.2250738585072014e-308, 1e-45, NULL, NULL, NULL, NULL, NULL, NULL, DEFAULT)`)
	p.exec("CREATE TABLE bag (a int, b text)")
	p.exec("INSERT INTO bag VALUES (1, 'x'), (1, 'x'), (2, 'y')")
	p.exec("CREATE PUBLICATION cdcflow FOR TABLE filt WHERE (v > 5), listed (id, a), edge, bag")
	stop, stderr := p.serve(p.config())
	defer func() { _ = stop() }()
	p.waitEqual("a row filter, a column list, edge values across time zones and date styles")
	out, err := p.compareOnce()
	require.NoError(t, err, out)
	require.Contains(t, out, `"public"."filt"`)
	require.Equal(t, []string{"5"}, p.targetQuery("SELECT count(*)::text FROM filt"), "the row filter's rows")
	require.NoError(t, stop(), stderr.String())

	for _, c := range []struct{ what, change, undo string }{
		{"a json null made SQL NULL", "UPDATE edge SET js = NULL WHERE id = 1", "UPDATE edge SET js = 'null' WHERE id = 1"},
		{"a jsonb null made SQL NULL", "UPDATE edge SET j = NULL WHERE id = 1", "UPDATE edge SET j = 'null' WHERE id = 1"},
		{"a filtered-in row missing", "DELETE FROM filt WHERE id = 7", "INSERT INTO filt VALUES (7, 7)"},
		{"a generated column computed differently", "ALTER TABLE edge DROP COLUMN twice; ALTER TABLE edge ADD COLUMN twice numeric GENERATED ALWAYS AS (n * 3) STORED",
			"ALTER TABLE edge DROP COLUMN twice; ALTER TABLE edge ADD COLUMN twice numeric GENERATED ALWAYS AS (n * 2) STORED"},
		{"-0 made 0", "UPDATE edge SET f = 0 WHERE id = 2", "UPDATE edge SET f = '-0' WHERE id = 2"},
	} {
		p.targetExec(c.change)
		out, err := p.compareOnce()
		require.ErrorIs(t, err, ErrDiffer, "%s:\n%s", c.what, out)
		p.targetExec(c.undo)
		out, err = p.compareOnce()
		require.NoError(t, err, "%s undone:\n%s", c.what, out)
	}

	// --rows names the rows that differ: by key, in the key's text order,
	// up to the count asked for; without a key, by copies.
	p.targetExec("DELETE FROM filt WHERE id = 7; UPDATE filt SET v = 99 WHERE id = 9; INSERT INTO filt VALUES (70, 70), (71, 71)")
	p.targetExec("DELETE FROM bag WHERE ctid = (SELECT ctid FROM bag WHERE a = 1 LIMIT 1); INSERT INTO bag VALUES (3, 'z')")
	var rows bytes.Buffer
	err = CompareRows(context.Background(), p.src.DSN, p.dst.DSN, "cdcflow", 3, &rows)
	require.ErrorIs(t, err, ErrDiffer)
	require.Contains(t, rows.String(), "  key (7): missing in the target\n  key (70): only in the target\n  key (71): only in the target\n",
		"the first three, in the key's text order")
	require.NotContains(t, rows.String(), "key (9)", "past the count asked for")
	require.Contains(t, rows.String(), "row (1,x): 2 in the source, 1 in the target")
	require.Contains(t, rows.String(), "row (3,z): 1 more in the target")
}

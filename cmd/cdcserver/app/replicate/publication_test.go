package replicate

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/testwait"
)

// leftOut names the tables status lists as left out.
func leftOut(st *Status) []string {
	var out []string
	for _, l := range st.LeftOut {
		out = append(out, l.Table)
	}
	return out
}

// pgbench's schema, made by pgbench -i unmodified (pgbench_history has no
// key), replicates, and the publication serve creates never makes the
// source refuse a write: it lists the tables with a key (FOR ALL TABLES
// publishing updates made every UPDATE and DELETE of a keyless table fail
// on the source), so pgbench_history's UPDATE and DELETE still succeed
// there, and status names it as left out with why. A keyed table created
// while running joins (the poll adds it and it is copied), a keyless one
// is left out and keeps its writes, and --exclude keeps a table out.
func TestPgbenchsSchemaReplicatesAndTheSourceKeepsItsWrites(t *testing.T) {
	p := newPair(t)
	out, err := p.src.Client("pgbench", "-i", "-s", "1", "-q", "postgres")
	require.NoError(t, err, "%s", out)
	p.exec("CREATE TABLE audit_log (id int PRIMARY KEY, note text)")
	p.exec("INSERT INTO audit_log VALUES (1, 'kept out')")
	cfg := p.config()
	cfg.PublicationPollInterval = 200 * time.Millisecond
	cfg.Exclude = patternList{"public.audit_*"}
	stop, stderr := p.serve(cfg)
	defer func() { _ = stop() }()
	p.waitEqual("pgbench's tables")

	out, err = p.src.Client("pgbench", "-T", "3", "-c", "2", "postgres")
	require.NoError(t, err, "%s", out)
	p.waitEqual("after pgbench -T")

	var all bool
	require.NoError(t, p.conn.QueryRow(context.Background(), "SELECT puballtables FROM pg_publication WHERE pubname = 'cdcflow'").Scan(&all))
	require.False(t, all, "a publication that lists its tables")
	p.exec("UPDATE pgbench_history SET delta = delta + 1 WHERE tid = 1")
	p.exec("DELETE FROM pgbench_history WHERE tid = 2")
	st := p.status()
	require.Contains(t, leftOut(st), "public.pgbench_history", "status names it")
	require.NotContains(t, leftOut(st), "public.audit_log", "an excluded table is no concern of the changefeed's")
	for _, tb := range st.Tables {
		require.NotEqual(t, `"public"."audit_log"`, tb.Table, "--exclude kept it out")
	}

	p.exec("CREATE TABLE later (id int PRIMARY KEY, v text)")
	p.exec("INSERT INTO later SELECT g, 'v' FROM generate_series(1, 100) g")
	p.exec("CREATE TABLE later_keyless (a int, b text)")
	p.exec("INSERT INTO later_keyless VALUES (1, 'x')")
	testwait.Within(t, 2*time.Minute, "the keyed table added and copied", func() bool { return p.targetCountOrNone("public.later") == 100 })
	p.exec("UPDATE later_keyless SET b = 'y'")
	p.exec("DELETE FROM later_keyless")
	p.waitEqual("with the table that joined")
	require.Contains(t, leftOut(p.status()), "public.later_keyless")
	require.NoError(t, stop(), stderr.String())
}

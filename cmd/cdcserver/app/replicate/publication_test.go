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

// insertsOnly lists the tables status marks inserts only.
func insertsOnly(st *Status) []string {
	var out []string
	for _, t := range st.Tables {
		if t.InsertsOnly {
			out = append(out, t.Table)
		}
	}
	return out
}

// pgbench's schema, made by pgbench -i unmodified (pgbench_history has no
// key), replicates whole, pgbench_history included, and the publications
// serve creates never make the source refuse a write: the keyed tables
// are in its publication, pgbench_history in the companion that publishes
// only inserts (FOR ALL TABLES publishing updates made every UPDATE and
// DELETE of a keyless table fail on the source), so its UPDATE and DELETE
// still succeed there, and status marks it inserts only. A keyed table and
// a keyless one under REPLICA IDENTITY FULL created while running join
// (the poll adds them, they are copied, the second in one chunk by its
// snapshot, and its updates and deletes replicate), and --exclude keeps a
// table out.
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
	p.waitEqual("after pgbench -T, pgbench_history's inserts included")
	require.Positive(t, p.targetCountOrNone("public.pgbench_history"))

	var all bool
	require.NoError(t, p.conn.QueryRow(context.Background(), "SELECT bool_or(puballtables) FROM pg_publication").Scan(&all))
	require.False(t, all, "publications that list their tables")
	st := p.status()
	require.Equal(t, []string{`"public"."pgbench_history"`}, insertsOnly(st), "status marks it")
	require.Empty(t, leftOut(st), "an excluded table is no concern of the changefeed's")
	for _, tb := range st.Tables {
		require.NotEqual(t, `"public"."audit_log"`, tb.Table, "--exclude kept it out")
	}

	p.exec("CREATE TABLE later (id int PRIMARY KEY, v text)")
	p.exec("INSERT INTO later SELECT g, 'v' FROM generate_series(1, 100) g")
	p.exec("CREATE TABLE later_keyless (a int, b text)")
	p.exec("ALTER TABLE later_keyless REPLICA IDENTITY FULL")
	p.exec("INSERT INTO later_keyless SELECT g % 10, 'x' FROM generate_series(1, 50) g")
	testwait.Within(t, 2*time.Minute, "the keyed table added and copied", func() bool { return p.targetCountOrNone("public.later") == 100 })
	testwait.Within(t, 2*time.Minute, "the keyless table added and copied", func() bool { return p.targetCountOrNone("public.later_keyless") == 50 })
	p.exec("UPDATE later_keyless SET b = 'y' WHERE a = 1")
	p.exec("DELETE FROM later_keyless WHERE a = 2")
	p.waitEqual("with the tables that joined")

	// pgbench_history's UPDATE and DELETE succeed on the source (a
	// publication of them would refuse them); they are not replicated.
	p.exec("UPDATE pgbench_history SET delta = delta + 1 WHERE tid = 1")
	p.exec("DELETE FROM pgbench_history WHERE tid = 2")
	require.NoError(t, stop(), stderr.String())
}

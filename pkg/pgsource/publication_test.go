package pgsource

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/common"
)

func TestATableRuleMatchesSchemaDotTableGlobs(t *testing.T) {
	r := TableRule{Include: []string{"public.*", "sales.orders"}, Exclude: []string{"public.audit_*"}}
	require.NoError(t, r.Validate())
	require.True(t, r.Matches("public", "t"))
	require.True(t, r.Matches("sales", "orders"))
	require.False(t, r.Matches("sales", "lines"))
	require.False(t, r.Matches("public", "audit_log"))
	require.True(t, TableRule{}.Matches("any", "table"), "no include: every table")
	for _, bad := range []string{"", "nodot", "public.[", "["} {
		require.ErrorIs(t, TableRule{Include: []string{bad}}.Validate(), ErrBadPattern, bad)
	}
}

// The publication a changefeed creates lists only tables with a key the
// role may publish; the rest are left out with why.
func TestSelectTablesLeavesOutWhatCannotBePublished(t *testing.T) {
	cands := []candidate{
		{oid: 1, schema: "public", name: "keyed", keyed: true, owned: true},
		{oid: 2, schema: "public", name: "history", replIdent: 'd', owned: true},
		{oid: 3, schema: "public", name: "full", replIdent: 'f', owned: true},
		{oid: 4, schema: "public", name: "theirs", keyed: true},
		{oid: 5, schema: "public", name: "audit_x", keyed: true, owned: true},
	}
	publish, left := selectTables(cands, TableRule{Exclude: []string{"public.audit_*"}})
	require.Len(t, publish, 1)
	require.Equal(t, uint32(1), publish[0].oid)
	var names []string
	for _, l := range left {
		names = append(names, l.Table)
	}
	require.Equal(t, []string{"public.full", "public.history", "public.theirs"}, names, "the excluded table is no concern")
	require.Contains(t, left[0].Reason, "replica identity full")
	require.Contains(t, left[2].Reason, "does not own")
}

// pubTables lists the publication's tables as the server has them.
func (e *srcEnv) pubTables() []string {
	e.t.Helper()
	rows, err := e.conn.Query(context.Background(), "SELECT tablename FROM pg_publication_tables WHERE pubname = 'cdcflow'")
	require.NoError(e.t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(e.t, err)
	sort.Strings(names)
	return names
}

// The publication Open creates is never FOR ALL TABLES (which publishes a
// keyless table's updates, and PostgreSQL then refuses them): it lists the
// tables with a key, and the poll of a managed one keeps that current:
// a table created with a key is added, one that loses its key is taken
// out (its UPDATE succeeds again), one given a key is added. A keyless
// table's UPDATE and DELETE succeed throughout.
func TestTheManagedPublicationListsTablesWithAKey(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t1 (id int PRIMARY KEY, v text)")
	e.exec("CREATE TABLE loose (a int, b text)")
	e.exec("INSERT INTO loose VALUES (1, 'x')")
	src := e.source(func(o *testOptions) {
		o.ManagePublication = true
		o.PublicationPollInterval = 50 * time.Millisecond
	})
	info, err := src.Open(context.Background())
	require.NoError(t, err)
	require.Equal(t, []string{"t1"}, e.pubTables())
	require.Len(t, info.LeftOut, 1)
	var all bool
	require.NoError(t, e.conn.QueryRow(context.Background(), "SELECT puballtables FROM pg_publication WHERE pubname = 'cdcflow'").Scan(&all))
	require.False(t, all)
	e.exec("UPDATE loose SET b = 'y'")
	e.exec("DELETE FROM loose")
	sub, err := src.Subscribe(common.TableSpan(int64(e.oid("t1"))), info.SnapshotTs-1, newRecordingSink(t, info.SnapshotTs-1))
	require.NoError(t, err)
	defer sub.Close()
	require.NoError(t, src.Start()) // the poll runs once the snapshot is copied

	e.exec("CREATE TABLE t2 (id int PRIMARY KEY)")
	testwait.Within(t, time.Minute, "t2 added", func() bool { return len(e.pubTables()) == 2 })
	e.exec("ALTER TABLE t1 DROP CONSTRAINT t1_pkey")
	testwait.Within(t, time.Minute, "t1 taken out", func() bool { return len(e.pubTables()) == 1 })
	e.exec("UPDATE t1 SET v = 'ok'") // would fail while published with updates and no identity
	e.exec("ALTER TABLE loose ADD PRIMARY KEY (a)")
	testwait.Within(t, time.Minute, "loose added", func() bool { return len(e.pubTables()) == 2 })
	require.Equal(t, []string{"loose", "t2"}, e.pubTables())
}

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

// The tables a changefeed takes go into its publication when the target
// can apply their updates and deletes (a key, or REPLICA IDENTITY FULL),
// into its companion of inserts otherwise; those the role may not publish
// are left out with why.
func TestSelectTablesSplitsWholeFromInsertsOnly(t *testing.T) {
	cands := []candidate{
		{oid: 1, schema: "public", name: "keyed", keyed: true, owned: true},
		{oid: 2, schema: "public", name: "history", replIdent: 'd', owned: true},
		{oid: 3, schema: "public", name: "full", replIdent: 'f', owned: true},
		{oid: 4, schema: "public", name: "theirs", keyed: true},
		{oid: 5, schema: "public", name: "audit_x", keyed: true, owned: true},
		{oid: 6, schema: "public", name: "nothing", replIdent: 'n', owned: true},
	}
	whole, inserts, left := selectTables(cands, TableRule{Exclude: []string{"public.audit_*"}})
	oids := func(cs []candidate) (out []uint32) {
		for _, c := range cs {
			out = append(out, c.oid)
		}
		return out
	}
	require.Equal(t, []uint32{1, 3}, oids(whole))
	require.Equal(t, []uint32{2, 6}, oids(inserts))
	require.Len(t, left, 1, "the excluded table is no concern")
	require.Equal(t, "public.theirs", left[0].Table)
	require.Contains(t, left[0].Reason, "does not own")
}

// pubTables lists a publication's tables as the server has them.
func (e *srcEnv) pubTables(pub string) []string {
	e.t.Helper()
	rows, err := e.conn.Query(context.Background(), "SELECT tablename FROM pg_publication_tables WHERE pubname = $1", pub)
	require.NoError(e.t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(e.t, err)
	sort.Strings(names)
	return names
}

// The publications Open creates are never FOR ALL TABLES (which publishes
// a keyless table's updates, and PostgreSQL then refuses them): the
// changefeed's lists the tables with a key, its companion the keyless
// ones, whose inserts alone it publishes, and the poll of managed ones
// keeps that current: a table created with a key is added, one that loses
// its key moves to the companion (its UPDATE succeeds again), one given a
// key moves back. A keyless table's UPDATE and DELETE succeed throughout,
// and its inserts stream.
func TestTheManagedPublicationsNeverRefuseAKeylessUpdate(t *testing.T) {
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
	require.Equal(t, []string{"t1"}, e.pubTables("cdcflow"))
	require.Equal(t, []string{"loose"}, e.pubTables("cdcflow_inserts"))
	require.Empty(t, info.LeftOut)
	require.Equal(t, []string{"public.loose"}, info.InsertsOnly)
	var all bool
	require.NoError(t, e.conn.QueryRow(context.Background(), "SELECT bool_or(puballtables) FROM pg_publication").Scan(&all))
	require.False(t, all)
	e.exec("UPDATE loose SET b = 'y'")
	e.exec("DELETE FROM loose")
	sink := newRecordingSink(t, info.SnapshotTs-1)
	sub, err := src.Subscribe(common.TableSpan(int64(e.oid("loose"))), info.SnapshotTs-1, sink)
	require.NoError(t, err)
	defer sub.Close()
	require.NoError(t, src.Start()) // the poll runs once the snapshot is copied
	e.exec("INSERT INTO loose VALUES (2, 'streamed')")
	sink.waitFor("the insert", func() bool { return len(sink.rows) == 2 })
	require.Equal(t, "streamed", text(sink.changes()[1], "b"))

	e.exec("CREATE TABLE t2 (id int PRIMARY KEY)")
	testwait.Within(t, time.Minute, "t2 added", func() bool { return len(e.pubTables("cdcflow")) == 2 })
	e.exec("ALTER TABLE t1 DROP CONSTRAINT t1_pkey")
	testwait.Within(t, time.Minute, "t1 moved", func() bool { return len(e.pubTables("cdcflow_inserts")) == 2 })
	require.Equal(t, []string{"t2"}, e.pubTables("cdcflow"))
	e.exec("UPDATE t1 SET v = 'ok'") // would fail while published with updates and no identity
	e.exec("ALTER TABLE loose ADD PRIMARY KEY (a)")
	testwait.Within(t, time.Minute, "loose moved", func() bool { return len(e.pubTables("cdcflow")) == 2 })
	require.Equal(t, []string{"loose", "t2"}, e.pubTables("cdcflow"))
	require.Equal(t, []string{"t1"}, e.pubTables("cdcflow_inserts"))
}

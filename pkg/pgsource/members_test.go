package pgsource

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// TestMembershipsGivesEachPublishedTableItsRow: a table named by the
// publication has its own pg_publication_rel row, the partitions of a
// partitioned table named by it have the parent's (the stream sends them
// as themselves), a partition named itself keeps its own, a table dropped
// from the publication and added again has a new row, and the publication
// is identified by its oid.
func TestMembershipsGivesEachPublishedTableItsRow(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE plain (id int PRIMARY KEY)")
	e.exec("CREATE TABLE parted (id int PRIMARY KEY) PARTITION BY RANGE (id)")
	e.exec("CREATE TABLE parted_1 PARTITION OF parted FOR VALUES FROM (0) TO (10)")
	e.exec("CREATE TABLE parted_2 PARTITION OF parted FOR VALUES FROM (10) TO (20) PARTITION BY RANGE (id)")
	e.exec("CREATE TABLE parted_2a PARTITION OF parted_2 FOR VALUES FROM (10) TO (20)")
	e.exec("CREATE TABLE outside (id int PRIMARY KEY)")
	e.exec("CREATE PUBLICATION cdcflow FOR TABLE plain, parted, parted_1")
	src := e.source(nil)
	ctx := context.Background()
	m, err := src.Memberships(ctx)
	require.NoError(t, err)
	row := func(table string) uint32 {
		var oid uint32
		require.NoError(t, e.conn.QueryRow(ctx, "SELECT oid FROM pg_publication_rel WHERE prrelid = $1::regclass", table).Scan(&oid))
		return oid
	}
	var pub uint32
	require.NoError(t, e.conn.QueryRow(ctx, "SELECT oid FROM pg_publication WHERE pubname = 'cdcflow'").Scan(&pub))
	require.Equal(t, pub, m.Publication)
	require.Equal(t, map[uint32]uint32{
		e.oid("plain"):     row("plain"),
		e.oid("parted_1"):  row("parted_1"),
		e.oid("parted_2a"): row("parted"),
	}, m.Rows)

	before := m.Rows[e.oid("plain")]
	e.exec("ALTER PUBLICATION cdcflow DROP TABLE plain")
	e.exec("ALTER PUBLICATION cdcflow ADD TABLE plain")
	m, err = src.Memberships(ctx)
	require.NoError(t, err)
	require.NotEqual(t, before, m.Rows[e.oid("plain")], "added again: a new row")
	require.NotZero(t, m.Rows[e.oid("plain")])
}

// TestARejoinBeforeTheFirstPollIsTold: Open records the membership rows it
// finds, so a table removed from the publication and added again before
// the poll's first round is told of (OnRejoin) by that round. Without the
// record the first round took the new row for the first one seen.
func TestARejoinBeforeTheFirstPollIsTold(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t1 (id int PRIMARY KEY)")
	e.exec("CREATE TABLE t2 (id int PRIMARY KEY)")
	e.exec("CREATE PUBLICATION cdcflow FOR TABLE t1, t2")
	rejoined := make(chan pgcodec.Relation, 1)
	src := e.source(func(o *testOptions) {
		o.PublicationPollInterval = -1 // the test polls
		o.OnRejoin = func(rel pgcodec.Relation) { rejoined <- rel }
	})
	openAndSubscribe(t, e, src, "t1", "t2")
	src.mu.Lock()
	src.mu.snapshotDone = true // the poll runs once the snapshot is done (none here: nothing to copy)
	src.mu.Unlock()
	e.exec("ALTER PUBLICATION cdcflow DROP TABLE t2")
	e.exec("ALTER PUBLICATION cdcflow ADD TABLE t2")
	ctx := context.Background()
	conn, err := connect(ctx, e.pg.DSN)
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.NoError(t, src.pollPublication(ctx, conn))
	select {
	case rel := <-rejoined:
		require.Equal(t, "t2", rel.Name)
	default:
		t.Fatal("the first round did not tell of t2's rejoin")
	}
}

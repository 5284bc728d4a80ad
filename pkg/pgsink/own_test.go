package pgsink

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// A target table created first with columns of its own (one with a
// default, one nullable) is written with the source's columns, its own
// left to it, at this bind and at a later process's (recorded when first
// bound); a column the source then drops (the relation lacks one that was
// the source's) still stops it. Own columns had stopped the table at
// once, as a column gone from the source.
func TestATargetTableKeepsColumnsOfItsOwn(t *testing.T) {
	e := newSinkEnv(t, nil)
	ctx := context.Background()
	_, err := e.conn.Exec(ctx, `CREATE SCHEMA app; CREATE TABLE app.t (id integer PRIMARY KEY, v text, big text,
  synced boolean NOT NULL DEFAULT true, note text)`)
	require.NoError(t, err)
	id := common.DispatcherIDFromUint64(1)
	require.NoError(t, e.sink.Bind(ctx, id, relT, 10))
	require.Empty(t, e.sink.Stopped())
	require.NoError(t, e.sink.BeginEpoch(id, 1, 10))
	require.NoError(t, e.sink.ApplyRows(id, rows(11, tx(pgcodec.Insert, col("id", "1"), col("v", "a"), null("big")))))
	require.NoError(t, e.sink.Checkpoint(id, 11))
	e.dur.wait(t, id, 11)
	_, err = e.conn.Exec(ctx, "UPDATE app.t SET note = 'mine'")
	require.NoError(t, err)
	require.NoError(t, e.sink.ApplyRows(id, rows(12, tx(pgcodec.Update, col("id", "1"), col("v", "b"), null("big")))))
	require.NoError(t, e.sink.Checkpoint(id, 12))
	e.dur.wait(t, id, 12)
	require.Equal(t, []string{`{"id":1,"v":"b","big":null,"synced":true,"note":"mine"}`}, e.contents("app.t"),
		"the target's own columns: a default on insert, its value kept on update")
	_, err = e.conn.Exec(ctx, "UPDATE app.t SET synced = false")
	require.NoError(t, err)
	require.NoError(t, e.sink.ApplyRows(id, rows(13, move("1", col("id", "7"), col("v", "moved")))))
	require.NoError(t, e.sink.ApplyRows(id, rows(14, move("404", col("id", "8"), col("v", "no old row")))))
	require.NoError(t, e.sink.Checkpoint(id, 14))
	e.dur.wait(t, id, 14)
	require.Equal(t, []string{`{"id":7,"v":"moved","big":null,"synced":false,"note":"mine"}`,
		`{"id":8,"v":"no old row","big":null,"synced":true,"note":null}`}, e.contents("app.t"),
		"a move carries them with the row, their defaults where the old row is not there")
	e.sink.Close()

	// A later process: the table was written to, so its own columns are
	// the recorded ones.
	s2, err := New(Options{DSN: e.pg.DSN, Workers: 2, FlushInterval: 5 * time.Millisecond, MaxFlushInterval: DefaultFlushInterval})
	require.NoError(t, err)
	d2 := newDurables()
	s2.SetDurable(d2.record)
	require.NoError(t, s2.Start(ctx))
	defer s2.Close()
	require.NoError(t, s2.Bind(ctx, id, relT, 14))
	require.Empty(t, s2.Stopped())
	require.NoError(t, s2.BeginEpoch(id, 1, 14))
	require.NoError(t, s2.ApplyRows(id, rows(15, tx(pgcodec.Insert, col("id", "2"), col("v", "c"), null("big")))))
	require.NoError(t, s2.Checkpoint(id, 15))
	d2.wait(t, id, 15)
	require.Len(t, e.contents("app.t"), 3)

	dropped := relT
	dropped.Columns = relT.Columns[:2] // "big" dropped in the source
	require.NoError(t, s2.ApplyDDL(id, &messaging.DDL{TableID: 100, CommitTs: 16, Query: pgcodec.RelationDDL(dropped)}))
	require.NoError(t, s2.ApplyRows(id, rows(17, tx(pgcodec.Insert, col("id", "3"), col("v", "d")))))
	require.NoError(t, s2.Checkpoint(id, 17))
	d2.wait(t, id, 17)
	require.Empty(t, s2.Stopped())
	require.Contains(t, e.contents("app.t"), `{"id":3,"v":"d","synced":true,"note":null}`,
		"the source's dropped column dropped in the target too, the table's own columns kept")
}

// A column of the target's own that no row could be written without
// (NOT NULL, no default) stops the table at its bind, saying so.
func TestATargetColumnNoRowCanBeWrittenWithoutStopsTheTable(t *testing.T) {
	e := newSinkEnv(t, nil)
	ctx := context.Background()
	_, err := e.conn.Exec(ctx, `CREATE SCHEMA app; CREATE TABLE app.t (id integer PRIMARY KEY, v text, big text, tenant int NOT NULL)`)
	require.NoError(t, err)
	require.NoError(t, e.sink.Bind(ctx, common.DispatcherIDFromUint64(1), relT, 10))
	require.Len(t, e.sink.Stopped(), 1)
	require.Contains(t, e.sink.Stopped()[0], `column "tenant" is NOT NULL without a default`)
}

// A column the source adds under the name of one of the target table's
// own stops the table: applied, the source's values would overwrite the
// user's (and the column, still taken for the target's own, would hide
// the source dropping it later).
func TestASourceColumnNamedLikeAnOwnOneStopsTheTable(t *testing.T) {
	e := newSinkEnv(t, nil)
	ctx := context.Background()
	_, err := e.conn.Exec(ctx, `CREATE SCHEMA app; CREATE TABLE app.t (id integer PRIMARY KEY, v text, big text, note text)`)
	require.NoError(t, err)
	id := common.DispatcherIDFromUint64(1)
	require.NoError(t, e.sink.Bind(ctx, id, relT, 10))
	require.NoError(t, e.sink.BeginEpoch(id, 1, 10))
	added := relT
	added.Columns = append(append([]pgcodec.Column(nil), relT.Columns...), pgcodec.Column{Name: "note", Type: "text", TypeOID: 25})
	require.NoError(t, e.sink.ApplyDDL(id, &messaging.DDL{TableID: 100, CommitTs: 11, Query: pgcodec.RelationDDL(added)}))
	require.NoError(t, e.sink.ApplyRows(id, rows(12, tx(pgcodec.Insert, col("id", "1"), col("v", "a"), null("big"), col("note", "from source")))))
	require.NoError(t, e.sink.Checkpoint(id, 12))
	testwait.Within(t, 60*time.Second, "the table stopped", func() bool { return len(e.sink.Stopped()) == 1 })
	require.Contains(t, e.sink.Stopped()[0], `has a column "note" now, and the target table has one of its own by that name`)
	require.Empty(t, e.contents("app.t"))
}

package pgsink

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// A relation's stored generated columns (which PostgreSQL 15 does not
// publish) are created in the target with the source's expression, so the
// target computes them for every row the sink writes, through a column
// added after; a version without one drops it (every version the source
// sends has the table's generated columns: the stream's get them from the
// catalog or the DDL capture), before a column it reads is dropped.
func TestGeneratedColumnsAreComputedByTheTarget(t *testing.T) {
	e := newSinkEnv(t, nil)
	id := common.DispatcherIDFromUint64(1)
	rel := pgcodec.Relation{OID: 400, Schema: "app", Name: "g", Columns: []pgcodec.Column{
		{Name: "id", Type: "integer", TypeOID: 23, Key: true}, {Name: "a", Type: "text", TypeOID: 25}},
		Generated: []pgcodec.GeneratedColumn{{Name: "up", Type: "text", Expr: "(upper(a) || ';'::text)"}}}
	ctx := context.Background()
	require.NoError(t, e.sink.Bind(ctx, id, rel, 10))
	require.NoError(t, e.sink.BeginEpoch(id, 1, 10))
	require.NoError(t, e.sink.ApplyRows(id, rows(12, tx(pgcodec.Insert, col("id", "1"), col("a", "x")))))
	added := rel
	added.Columns = append(append([]pgcodec.Column(nil), rel.Columns...), pgcodec.Column{Name: "b", Type: "integer", TypeOID: 23})
	require.NoError(t, e.sink.ApplyDDL(id, &messaging.DDL{TableID: 400, CommitTs: 13, Query: pgcodec.RelationDDL(added)}))
	require.NoError(t, e.sink.ApplyRows(id, rows(14, tx(pgcodec.Update, col("id", "1"), col("a", "y"), col("b", "2")))))
	require.NoError(t, e.sink.Checkpoint(id, 14))
	e.dur.wait(t, id, 14)
	require.Equal(t, []string{`{"id":1,"a":"y","up":"Y;","b":2}`}, e.contents("app.g"))
	// a dropped with CASCADE at the source, which drops up, reading it.
	dropped := added
	dropped.Generated = nil
	dropped.Columns = []pgcodec.Column{added.Columns[0], added.Columns[2]}
	require.NoError(t, e.sink.ApplyDDL(id, &messaging.DDL{TableID: 400, CommitTs: 15, Query: pgcodec.RelationDDL(dropped)}))
	require.NoError(t, e.sink.ApplyRows(id, rows(16, tx(pgcodec.Update, col("id", "1"), col("b", "3")))))
	require.NoError(t, e.sink.Checkpoint(id, 16))
	e.dur.wait(t, id, 16)
	require.Equal(t, []string{`{"id":1,"b":3}`}, e.contents("app.g"))
	require.Empty(t, e.sink.Stopped())
}

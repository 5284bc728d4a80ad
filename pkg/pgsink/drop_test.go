package pgsink

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// A source table dropped is dropped in the target after its last rows,
// with its checkpoint row, and a later checkpoint of its dispatcher
// writes none again (a table created again under its name then binds
// as new).
func TestADroppedTableIsDroppedInTheTarget(t *testing.T) {
	e := newSinkEnv(t, func(o *Options) { o.Logger = zaptest.NewLogger(t) })
	id := common.DispatcherIDFromUint64(1)
	ctx := context.Background()
	require.NoError(t, e.sink.Bind(ctx, id, relT, 10))
	require.NoError(t, e.sink.BeginEpoch(id, 1, 10))
	require.NoError(t, e.sink.ApplyRows(id, rows(12, tx(pgcodec.Insert, col("id", "1"), col("v", "a"), null("big")))))
	require.NoError(t, e.sink.Checkpoint(id, 12))
	e.dur.wait(t, id, 12)
	require.NoError(t, e.sink.ApplyDDL(id, &messaging.DDL{TableID: 100, CommitTs: 13, Query: pgcodec.DropTableDDL(100)}))
	require.NoError(t, e.sink.Checkpoint(id, 16))
	e.dur.wait(t, id, 16)
	var tables, ckpts int
	require.NoError(t, e.conn.QueryRow(ctx, "SELECT count(*) FROM pg_class WHERE oid = to_regclass('app.t')").Scan(&tables))
	require.NoError(t, e.conn.QueryRow(ctx, "SELECT count(*) FROM cdcflow.checkpoints").Scan(&ckpts))
	require.Zero(t, tables, "the target table dropped")
	require.Zero(t, ckpts, "and its checkpoint row, not written again")
	require.Empty(t, e.sink.Stopped())
}

package pgsource

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/pgtest"
	"github.com/cdcflow/eventservice/pkg/common"
)

// TablePositions keeps a slot's last positions, finds a saved one by its
// LSN, forgets a slot, and refuses a row that holds what it never writes
// (a negative commit-ts, which as a Ts would be past every commit) with
// ErrCorruptPosition rather than resuming past everything.
func TestTablePositionsKeepFindAndRefuseACorruptOne(t *testing.T) {
	pg := pgtest.Start(t)
	ctx := context.Background()
	p, err := NewTablePositions(ctx, pg.DSN)
	require.NoError(t, err)
	defer p.Close()
	for i := range uint64(positionsKept + 4) {
		require.NoError(t, p.Save(ctx, "s", Position{LSN: 100 + i, Ts: common.Ts(1000 + i)}))
	}
	got, ok, err := p.Load(ctx, "s", 100+positionsKept+3)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, Position{LSN: 100 + positionsKept + 3, Ts: 1000 + positionsKept + 3}, got)
	_, ok, err = p.Load(ctx, "s", 100)
	require.NoError(t, err)
	require.False(t, ok, "older than the last positionsKept: deleted")

	conn, err := pgx.Connect(ctx, pg.DSN)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "UPDATE cdcflow.source_positions SET ts = -5 WHERE lsn = $1", 100+positionsKept+3)
	require.NoError(t, err)
	_, ok, err = p.Load(ctx, "s", 100+positionsKept+3)
	require.ErrorIs(t, err, ErrCorruptPosition)
	require.False(t, ok)

	require.NoError(t, p.Forget(ctx, "s"))
	_, ok, err = p.Load(ctx, "s", 100+positionsKept+2)
	require.NoError(t, err)
	require.False(t, ok, "forgotten")
}

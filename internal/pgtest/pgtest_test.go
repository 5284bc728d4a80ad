package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestStartServesQueries starts a real server and runs a query on it.
func TestStartServesQueries(t *testing.T) {
	s := Start(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, s.DSN)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var v string
	require.NoError(t, conn.QueryRow(ctx, "SHOW server_version").Scan(&v))
	require.Contains(t, v, "15.")
}

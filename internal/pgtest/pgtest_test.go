package pgtest

import (
	"context"
	"net"
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

// A logical server has wal_level=logical; a stopped one refuses
// connections and serves again on the same address after Restart, its
// data kept.
func TestLogicalServerStopsAndRestarts(t *testing.T) {
	s := StartWith(t, Options{Logical: true})
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, s.DSN)
	require.NoError(t, err)
	var level string
	require.NoError(t, conn.QueryRow(ctx, "SHOW wal_level").Scan(&level))
	require.Equal(t, "logical", level)
	_, err = conn.Exec(ctx, "CREATE TABLE kept (id int)")
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))

	require.NoError(t, s.Stop())
	_, err = pgx.Connect(ctx, s.DSN)
	require.Error(t, err, "a stopped server refuses connections")
	require.NoError(t, s.Restart())
	conn, err = pgx.Connect(ctx, s.DSN)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var n int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = 'kept'").Scan(&n))
	require.Equal(t, 1, n, "its data kept")
}

// The port a server is given is below the kernel's ephemeral range, where
// no outgoing connection can be handed it before the server binds it.
func TestFreePortIsBelowTheEphemeralRange(t *testing.T) {
	low := ephemeralLow()
	for range 50 {
		port, err := freePort()
		require.NoError(t, err)
		require.GreaterOrEqual(t, port, portFloor)
		require.Less(t, port, low)
	}
}

// A start that fails because something else took the port says so
// (errPortTaken, which Launch answers with another port), and the server
// starts once the port is free again.
func TestAStartOnATakenPortSaysSo(t *testing.T) {
	s := Start(t)
	require.NoError(t, s.Stop())
	l, err := net.Listen("tcp", s.Addr)
	require.NoError(t, err)
	err = s.Restart()
	require.ErrorIs(t, err, errPortTaken)
	require.NoError(t, l.Close())
	require.NoError(t, s.Restart())
	conn, err := pgx.Connect(context.Background(), s.DSN)
	require.NoError(t, err)
	require.NoError(t, conn.Close(context.Background()))
}

// A server given a locale of its own runs under it (money's format is
// lc_monetary's: ja_JP has no fractional digits), also after a restart.
func TestAServerRunsUnderALocaleOfItsOwn(t *testing.T) {
	s := StartWith(t, Options{Locales: []string{"ja_JP.UTF-8"}, Settings: []string{"lc_monetary=ja_JP.UTF-8"}})
	ctx := context.Background()
	money := func() string {
		conn, err := pgx.Connect(ctx, s.DSN)
		require.NoError(t, err)
		defer conn.Close(ctx)
		var v string
		require.NoError(t, conn.QueryRow(ctx, "SELECT 1234::money::text").Scan(&v))
		return v
	}
	require.Equal(t, "￥1,234", money())
	require.NoError(t, s.Stop())
	require.NoError(t, s.Restart())
	require.Equal(t, "￥1,234", money())
}

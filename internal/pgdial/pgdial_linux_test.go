package pgdial

import (
	"context"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestAppliedDialerProbesAndGivesUp: a connection dialled through an
// applied config has keepalives on at the package's idle, interval and
// count, and no TCP_USER_TIMEOUT (which would replace the count and cut a
// live peer's shut window short). Read back from the socket (a loopback listener stands in for the
// server: the options are the client socket's).
func TestAppliedDialerProbesAndGivesUp(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	cfg, err := pgconn.ParseConfig("postgres://x@" + ln.Addr().String() + "/x?connect_timeout=7")
	require.NoError(t, err)
	Apply(cfg)
	c, err := cfg.DialFunc(context.Background(), "tcp", ln.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	peer, err := ln.Accept()
	require.NoError(t, err)
	defer peer.Close()

	raw, err := c.(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	get := func(level, opt int) int {
		var v int
		var gerr error
		require.NoError(t, raw.Control(func(fd uintptr) { v, gerr = unix.GetsockoptInt(int(fd), level, opt) }))
		require.NoError(t, gerr)
		return v
	}
	require.Equal(t, 1, get(unix.SOL_SOCKET, unix.SO_KEEPALIVE))
	require.Equal(t, int(KeepAliveIdle.Seconds()), get(unix.IPPROTO_TCP, unix.TCP_KEEPIDLE))
	require.Equal(t, int(KeepAliveInterval.Seconds()), get(unix.IPPROTO_TCP, unix.TCP_KEEPINTVL))
	require.Equal(t, KeepAliveCount, get(unix.IPPROTO_TCP, unix.TCP_KEEPCNT))
	require.Zero(t, get(unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT))
}

// TestAUnixSocketIsDialledAsItIs: keepalives are for TCP; a Unix socket (a
// server's socket directory) dials without them.
func TestAUnixSocketIsDialledAsItIs(t *testing.T) {
	path := t.TempDir() + "/.s.PGSQL.5432"
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	defer ln.Close()
	cfg, err := pgconn.ParseConfig("postgres://x@localhost/x")
	require.NoError(t, err)
	Apply(cfg)
	c, err := cfg.DialFunc(context.Background(), "unix", path)
	require.NoError(t, err)
	c.Close()
}

package pgnotify

import (
	"context"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/pgdial"
	"github.com/cdcflow/eventservice/internal/pgtest"
)

// TestThePublishersConnectionsNoticeADeadHost: the pump's connections dial
// through pgdial (keepalives, a TCP user timeout), so a database host that
// vanishes fails a statement, whose batch is kept and retried on a new
// connection, instead of holding the pump for a quarter of an hour.
func TestThePublishersConnectionsNoticeADeadHost(t *testing.T) {
	srv := pgtest.Start(t)
	const keys = 10
	l, stop := listen(t, srv.DSN, "state", "1", keys)
	defer stop()
	p, err := New(Options{DSN: srv.DSN})
	require.NoError(t, err)
	require.NoError(t, p.Start())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	publishRound(t, p, keys, 1)
	waitListener(ctx, t, l, "the round")
	defer func() { require.NoError(t, p.Close(ctx, true)) }()
	p.mu.Lock()
	conns := append([]*pgx.Conn(nil), p.conns...)
	p.mu.Unlock()
	checked := 0
	for _, conn := range conns {
		if conn == nil {
			continue
		}
		raw, err := conn.PgConn().Conn().(*net.TCPConn).SyscallConn()
		require.NoError(t, err)
		var ms int
		var gerr error
		require.NoError(t, raw.Control(func(fd uintptr) {
			ms, gerr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, 0x12) // TCP_USER_TIMEOUT
		}))
		require.NoError(t, gerr)
		require.Equal(t, pgdial.UserTimeout, time.Duration(ms)*time.Millisecond)
		checked++
	}
	require.Positive(t, checked)
}

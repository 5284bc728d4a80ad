package pgsink

import (
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/pgdial"
)

// TestTheLanesNoticeADeadTarget: the lanes' (and the admin) connections
// dial through pgdial, so a target host that vanishes fails a lane's
// transaction (keepalives after 10 s of silence) and the lane reconnects,
// instead of waiting on a reply.
func TestTheLanesNoticeADeadTarget(t *testing.T) {
	e := newSinkEnv(t, nil)
	require.NotEmpty(t, e.sink.lanes)
	for _, l := range e.sink.lanes {
		raw, err := l.app.conn.PgConn().Conn().(*net.TCPConn).SyscallConn()
		require.NoError(t, err)
		var s int
		var gerr error
		require.NoError(t, raw.Control(func(fd uintptr) {
			s, gerr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE)
		}))
		require.NoError(t, gerr)
		require.Equal(t, pgdial.KeepAliveIdle, time.Duration(s)*time.Second, "lane %d", l.n)
	}
}

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
// transaction (keepalives, a TCP user timeout) and the lane reconnects,
// instead of waiting on a reply for a quarter of an hour.
func TestTheLanesNoticeADeadTarget(t *testing.T) {
	e := newSinkEnv(t, nil)
	require.NotEmpty(t, e.sink.lanes)
	for _, l := range e.sink.lanes {
		raw, err := l.conn.PgConn().Conn().(*net.TCPConn).SyscallConn()
		require.NoError(t, err)
		var ms int
		var gerr error
		require.NoError(t, raw.Control(func(fd uintptr) {
			ms, gerr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, 0x12) // TCP_USER_TIMEOUT
		}))
		require.NoError(t, gerr)
		require.Equal(t, pgdial.UserTimeout, time.Duration(ms)*time.Millisecond, "lane %d", l.n)
	}
}

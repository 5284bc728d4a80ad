package pgsource

import (
	"context"
	"crypto/tls"
	"net"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/pgdial"
	"github.com/cdcflow/eventservice/internal/pgtest"
)

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	server, ok := <-accepted
	require.True(t, ok, "accept failed")
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// watchReadable registers c's socket with an epoll instance of the test's
// own, edge-triggered as Go's netpoller registers it, and returns a probe
// that reports whether the kernel signalled it readable since the last
// probe (without waiting).
func watchReadable(t *testing.T, c net.Conn) func() bool {
	t.Helper()
	ep, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	require.NoError(t, err)
	t.Cleanup(func() { syscall.Close(ep) })
	raw, err := c.(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	var cerr error
	require.NoError(t, raw.Control(func(fd uintptr) {
		const edgeTriggered = 1 << 31 // EPOLLET, which package syscall spells as a negative int
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN | edgeTriggered, Fd: int32(fd)}
		cerr = syscall.EpollCtl(ep, syscall.EPOLL_CTL_ADD, int(fd), &ev)
	}))
	require.NoError(t, cerr)
	return func() bool {
		evs := make([]syscall.EpollEvent, 4)
		n, err := syscall.EpollWait(ep, evs, 0)
		require.NoError(t, err)
		return n > 0
	}
}

// lowat reads c's SO_RCVLOWAT.
func lowat(t *testing.T, c net.Conn) int {
	t.Helper()
	raw, err := c.(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	var v int
	var gerr error
	require.NoError(t, raw.Control(func(fd uintptr) {
		v, gerr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT)
	}))
	require.NoError(t, gerr)
	return v
}

// waitQueued waits until c's receive queue holds n bytes (FIONREAD): the
// peer's write has arrived, whatever the poll says.
func waitQueued(t *testing.T, c net.Conn, n int) {
	t.Helper()
	raw, err := c.(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	for {
		var q int
		var ierr error
		require.NoError(t, raw.Control(func(fd uintptr) {
			q, ierr = ioctlInt(int(fd), syscall.TIOCINQ) // SIOCINQ: bytes queued to read
		}))
		require.NoError(t, ierr)
		if q >= n {
			return
		}
		runtime.Gosched() // until the kernel has queued what the peer wrote
	}
}

func ioctlInt(fd int, req uint) (int, error) {
	var v int32
	_, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(unsafe.Pointer(&v)))
	if e != 0 {
		return 0, e
	}
	return int(v), nil
}

// TestLingerHushesTheSocketWhileItLingers, on a real loopback TCP socket:
// the short read that starts a linger raises the receive low-water mark, so
// what arrives during the linger does not signal the socket readable (no
// netpoller wake-up for a goroutine that sleeps); the read that ends the
// linger lowers it first (1, the default) and gets everything queued; a
// read that fills its buffer starts no linger and leaves the mark at 1.
// Without the hush the probe during the linger reports readable.
func TestLingerHushesTheSocketWhileItLingers(t *testing.T) {
	client, server := tcpPair(t)
	c := newLingerConn(client, 20*time.Millisecond)
	require.NotNil(t, c.hush, "a TCP socket can be hushed")
	readable := watchReadable(t, client)
	var duringLinger []bool
	c.sleep = func(time.Duration) {
		// The linger: a message arrives while the reader sleeps.
		_, err := server.Write([]byte("during"))
		require.NoError(t, err)
		waitQueued(t, client, len("during"))
		duringLinger = append(duringLinger, readable(), lowat(t, client) > 1)
	}
	c.stream()
	require.Equal(t, 1, lowat(t, client))

	_, err := server.Write([]byte("first"))
	require.NoError(t, err)
	buf := make([]byte, 64)
	n, err := c.Read(buf)
	require.NoError(t, err)
	require.Equal(t, "first", string(buf[:n]), "a short read")
	require.Equal(t, hushMark, lowat(t, client), "the short read hushed the socket")
	readable() // what the first write signalled

	n, err = c.Read(make([]byte, len("during")))
	require.NoError(t, err)
	require.Equal(t, len("during"), n)
	require.Equal(t, []bool{false, true}, duringLinger, "during the linger: not signalled readable, the mark raised")
	require.Equal(t, 1, lowat(t, client), "a full read starts no linger: the mark is back at 1")

	readable() // what lowering the mark signalled (it wakes a reader if anything is queued)
	_, err = server.Write([]byte("after"))
	require.NoError(t, err)
	waitQueued(t, client, len("after"))
	require.True(t, readable(), "unhushed, an arrival signals the socket")
}

// TestLingerWithoutHushStillLingers: a socket that refuses the mark (or
// has none) lingers all the same, and is not asked again.
func TestLingerWithoutHushStillLingers(t *testing.T) {
	calls := 0
	c := newLingerConn(&scriptedConn{chunks: [][]byte{[]byte("a"), []byte("b"), []byte("c")}}, 5*time.Millisecond)
	require.Nil(t, c.hush, "a socket that is not TCP has no hush")
	c.hush = func(bool) error { calls++; return syscall.ENOPROTOOPT }
	ft := &fakeTime{}
	ft.attach(c)
	c.stream()
	for range 3 {
		_, err := c.Read(make([]byte, 8))
		require.NoError(t, err)
	}
	require.Equal(t, 1, calls, "a refused hush is not tried again")
	require.Len(t, ft.slept, 2, "the reads after short ones lingered")
}

// keepIdle reads a TCP socket's TCP_KEEPIDLE (0: keepalives off).
func keepIdle(t *testing.T, c net.Conn) time.Duration {
	t.Helper()
	if l, ok := c.(*lingerConn); ok {
		c = l.Conn
	}
	raw, err := c.(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	var on, v int
	var gerr error
	require.NoError(t, raw.Control(func(fd uintptr) {
		if on, gerr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_KEEPALIVE); gerr == nil {
			v, gerr = syscall.GetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_KEEPIDLE)
		}
	}))
	require.NoError(t, gerr)
	return time.Duration(on*v) * time.Second
}

// TestTheSourcesConnectionsNoticeADeadHost: the catalog, copy and
// replication connections dial through pgdial (keepalives after 10 s of
// silence), so a source host that vanishes fails them instead of leaving a
// query waiting.
func TestTheSourcesConnectionsNoticeADeadHost(t *testing.T) {
	e := newSrcEnv(t)
	ctx := context.Background()
	conn, err := connect(ctx, e.pg.DSN)
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.Equal(t, pgdial.KeepAliveIdle, keepIdle(t, conn.PgConn().Conn()))
	repl, err := connectReplication(ctx, e.pg.DSN, 20*time.Millisecond)
	require.NoError(t, err)
	defer repl.Close(ctx)
	require.Equal(t, pgdial.KeepAliveIdle, keepIdle(t, repl.Conn()))
}

// TestTheLingerRunsUnderTLS: with TLS negotiated (pgx's default sslmode,
// prefer, does it with a server that has ssl on) the connection's Conn is
// the TLS layer, not the lingering socket under it; the linger is kept
// with the connection, so the stream still lingers and hushes. It was
// found by a type assertion on Conn, and silently off under TLS.
func TestTheLingerRunsUnderTLS(t *testing.T) {
	pg := pgtest.StartWith(t, pgtest.Options{Logical: true, TLS: true})
	ctx := context.Background()
	dsn := strings.Replace(pg.DSN, "sslmode=disable", "sslmode=require", 1)
	repl, err := connectReplication(ctx, dsn, 20*time.Millisecond)
	require.NoError(t, err)
	defer repl.Close(ctx)
	_, isTLS := repl.Conn().(*tls.Conn)
	require.True(t, isTLS, "TLS was negotiated")
	l := lingerOf(repl)
	require.NotNil(t, l, "the linger is found under TLS")
	require.NotNil(t, l.hush, "the socket under TLS is TCP")
	require.Equal(t, pgdial.KeepAliveIdle, keepIdle(t, l))
}

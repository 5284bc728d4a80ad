package remote

import (
	"context"
	"net"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/internal/tlstest"
	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// idleConns dials n TCP connections to addr from each of the loopback
// addresses 127.0.0.first.. that send nothing; they are closed at the
// test's end.
func idleConns(t *testing.T, addr string, first, ips, n int) []net.Conn {
	t.Helper()
	var out []net.Conn
	for ip := range ips {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(first+ip))}}
		for range n {
			c, err := d.Dial("tcp", addr)
			require.NoError(t, err)
			t.Cleanup(func() { _ = c.Close() })
			out = append(out, c)
		}
	}
	return out
}

// Connections that never start their TLS handshake cannot keep an
// authorized collector out: 320 of them from eight addresses hold at most
// MaxHandshakesPerIP each and MaxHandshakes in all, a collector from
// another address gets in (taking the place of the oldest of the address
// holding the most) and works, and the idle ones are closed once
// HandshakeTimeout passes on the server's clock.
func TestIdleConnectionsBeforeTheHandshakeDoNotKeepACollectorOut(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	ca := tlstest.NewCA(t, t.TempDir(), "test")
	srv, addr := serveTLS(t, ServerOptions{TLS: tlstest.ServerConfig(t, ca.Issue(t, "service", "service")),
		Policy: Policy{"collector-1": {"c1"}}, Clock: clk, LivenessTimeout: time.Hour}, &controlForTest{calls: make(chan any, 16)})
	idle := idleConns(t, addr, 2, 8, 40)
	testwait.For(t, "every idle connection was accepted or refused", func() bool {
		return srv.conns.count()+int(testutil.ToFloat64(srv.met.refusedConns)) == len(idle)
	})

	cli, err := NewClient(ClientOptions{Addr: addr, Target: "c1", Capacity: 16, CallTimeout: 5 * time.Second,
		TLS: tlstest.ClientConfig(t, ca.Issue(t, "one", "collector-1"))})
	require.NoError(t, err)
	require.NoError(t, cli.Start())
	defer cli.Close()
	require.NoError(t, cli.Remove(context.Background(), messaging.RemoveRequest{Dispatcher: disp, Registration: 7}), "the collector gets in")
	waitConnected(t, srv, "c1")
	require.NoError(t, srv.Send("c1", sampleMessages()[:1]))
	require.Equal(t, sampleMessages()[:1], receive(t, cli.Inbox(), 1), "and works")
	require.Equal(t, DefaultMaxHandshakes-1, srv.conns.handshakes(), "the collector's connection left its handshake; one idle one made room")

	clk.Advance(DefaultHandshakeTimeout)
	for i, c := range idle {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(30*time.Second))) // a failing test's bound, not ordering
		_, err := c.Read(make([]byte, 1))
		require.Error(t, err)
		require.NotErrorIs(t, err, os.ErrDeadlineExceeded, "idle connection %d: closed by the server, not timed out", i)
	}
	require.Zero(t, srv.conns.handshakes())
	require.Equal(t, 1, srv.conns.count(), "the collector's connection only")
	require.Equal(t, float64(len(idle)), testutil.ToFloat64(srv.met.refusedConns), "each idle one closed once: on accept, in its place, or at the deadline")
	require.NoError(t, cli.Remove(context.Background(), messaging.RemoveRequest{Dispatcher: disp, Registration: 7}), "the collector still works")
}

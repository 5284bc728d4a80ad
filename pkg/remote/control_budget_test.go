package remote

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/promutil"
	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// Slow Control requests hold a bounded budget and end at their deadline.
// A hostile peer (h2raw: it answers pings and honours flow control) opens
// ten connections of 64 Control calls each, announcing the largest
// request and sending 16 KiB of it, then nothing. Every call is charged
// or refused at once; what they hold (the ledger, and its gauge) is at
// most MaxControlBytesPerConnection per connection and
// MaxControlBytesPerIP for the address; the refused calls are ended at
// once. Once ControlReceiveTimeout passes on the server's clock, every
// call is ended and nothing is held; the server still serves.
func TestSlowControlRequestsHoldABoundedBudgetAndEndAtTheDeadline(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	reg := prometheus.NewRegistry()
	srv, addr, cp := serve(t, ServerOptions{Clock: clk, Registerer: reg, LivenessTimeout: time.Hour})
	const conns, streams = 10, maxStreamsPerConnection
	var peers []*h2raw
	for range conns {
		h := dialH2(t, addr)
		for range streams {
			h.slowControl(maxUpFrameBytes, 16<<10)
		}
		peers = append(peers, h)
	}
	refused := func(reason string) int { return int(testutil.ToFloat64(srv.met.refusedCalls.WithLabelValues(reason))) }
	testwait.For(t, "every call was charged or refused", func() bool {
		_, _, _, calls := srv.ctl.held()
		return calls+refused("control_budget") == conns*streams
	})
	total, maxConn, maxIP, calls := srv.ctl.held()
	t.Logf("%d calls hold %d bytes (at most %d on a connection), %d refused", calls, total, maxConn, refused("control_budget"))
	require.LessOrEqual(t, maxConn, int64(DefaultMaxControlBytesPerConnection))
	require.LessOrEqual(t, maxIP, int64(DefaultMaxControlBytesPerIP))
	require.Equal(t, total, maxIP, "one address")
	gauge, _, err := promutil.Sum(reg, "cdcflow_remote_server_control_held_bytes")
	require.NoError(t, err)
	require.Equal(t, float64(total), gauge)
	endedAll := func() int {
		n := 0
		for _, h := range peers {
			n += h.endedCount()
		}
		return n
	}
	testwait.For(t, "the refused calls were ended", func() bool { return endedAll() >= refused("control_budget") })

	clk.Advance(DefaultControlReceiveTimeout)
	testwait.For(t, "every call was ended", func() bool { return endedAll() == conns*streams })
	testwait.For(t, "nothing is held", func() bool {
		total, _, _, calls := srv.ctl.held()
		return total == 0 && calls == 0
	})
	require.Equal(t, calls, refused("control_deadline"), "each charged call ended at its deadline")

	var reply frame
	require.NoError(t, rawConn(t, addr).Invoke(context.Background(), controlMethod,
		&frame{b: appendRemove(nil, messaging.RemoveRequest{Dispatcher: disp, Registration: 7})}, &reply), "the server still serves")
	require.Equal(t, messaging.RemoveRequest{Dispatcher: disp, Registration: 7}, <-cp.calls)
}

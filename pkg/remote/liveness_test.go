package remote

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/faultproxy"
	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// livenessForTest is long in fake time so that gRPC's own keepalive (half
// of it, in real time) never fires during a test: the liveness under test
// is the streams' own, driven by the fake clock.
const livenessForTest = 60 * time.Second

// bigBatch is a message of about n bytes on the wire.
func bigBatch(seq uint64, n int) messaging.Message {
	return &messaging.DMLBatch{Header: hdr(seq), Rows: []common.Row{{Op: common.OpPut, Key: []byte("k"), Value: bytes.Repeat([]byte{'v'}, n),
		StartTs: 1, CommitTs: 2}}}
}

// A half-open link (a proxy that holds both directions, as when the peer's
// host vanished without FIN or RST): once nothing has arrived for the
// liveness timeout, the service declares the stream dead (Send is
// ErrUnavailable, not ErrBusy), releases its queued frames and the writer
// blocked in SendMsg, and closes the connection; the collector declares it
// dead too, dials a new connection and, once the link carries again,
// opens a new stream, reports the reconnect and receives again.
func TestHalfOpenLinkIsDeclaredDeadOnBothSides(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	srv, addr, _ := serve(t, ServerOptions{Clock: clk, LivenessTimeout: livenessForTest})
	proxy := faultproxy.Start(t, addr)
	cli, err := NewClient(ClientOptions{Addr: proxy.Addr, Target: "c1", Capacity: 8, Clock: clk, LivenessTimeout: livenessForTest,
		RetryBase: time.Millisecond, RetryMax: time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, cli.Start())
	defer cli.Close()
	waitConnected(t, srv, "c1")
	testwait.For(t, "the client's stream", func() bool { return cli.Streams() == 1 })

	down := proxy.Hold(faultproxy.Downstream)
	proxy.Hold(faultproxy.Upstream)
	// Frames larger than HTTP/2's windows: the writer blocks in SendMsg
	// on one (gRPC's write quota lets the first through, the second
	// blocks) and the rest wait in the queue.
	require.NoError(t, srv.Send("c1", []messaging.Message{bigBatch(2, 4<<20)}))
	require.NoError(t, srv.Send("c1", []messaging.Message{bigBatch(3, 4<<20)}))
	require.NoError(t, srv.Send("c1", []messaging.Message{bigBatch(4, 4<<20)}))
	<-down
	srv.mu.Lock()
	p := srv.mu.peers["c1"]
	srv.mu.Unlock()
	testwait.For(t, "the writer is in SendMsg", func() bool { return p.live.writeStart.Load() != 0 })
	require.NoError(t, srv.Send("c1", []messaging.Message{bigBatch(5, 1)}), "still credit: the link looks alive")

	clk.Advance(livenessForTest + time.Second)
	testwait.For(t, "declared dead: Send is ErrUnavailable", func() bool {
		return errorsIsAny(srv.Send("c1", []messaging.Message{bigBatch(6, 1)}), messaging.ErrUnavailable)
	})
	p.mu.Lock()
	queued := len(p.mu.queue)
	p.mu.Unlock()
	require.Zero(t, queued, "the queued frames are released")
	testwait.For(t, "its connection is closed", func() bool { return srv.conns.count() == 0 })
	require.Equal(t, 1.0, testutil.ToFloat64(srv.met.deadLinks))
	require.Zero(t, srv.Connected())
	testwait.For(t, "the collector declared it dead too", func() bool { return testutil.ToFloat64(cli.met.deadLinks) == 1 })

	proxy.Release()
	// The client's retry timer runs on the fake clock: move it on until
	// the new stream is up.
	testwait.For(t, "the collector connected again", func() bool {
		clk.Advance(time.Millisecond)
		return srv.Send("c1", nil) == nil
	})
	select {
	case <-cli.Reconnected():
	case <-time.After(30 * time.Second):
		t.Fatal("no reconnect reported")
	}
	require.Equal(t, int64(2), cli.Streams())
	require.NoError(t, srv.Send("c1", sampleMessages()[:1]))
	require.Equal(t, sampleMessages()[:1], receive(t, cli.Inbox(), 1))
}

// A control call over a link that does not answer is ErrUnavailable
// within CallTimeout, not a context error the caller cannot classify.
func TestControlCallOverADeadLinkIsUnavailable(t *testing.T) {
	_, addr, _ := serve(t, ServerOptions{})
	proxy := faultproxy.Start(t, addr)
	cli, err := NewClient(ClientOptions{Addr: proxy.Addr, Target: "c1", CallTimeout: 200 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, cli.Start())
	defer cli.Close()
	require.NoError(t, cli.Remove(context.Background(), messaging.RemoveRequest{Dispatcher: disp, Registration: 7}))
	proxy.Hold(faultproxy.Upstream)
	proxy.Hold(faultproxy.Downstream)
	err = cli.Remove(context.Background(), messaging.RemoveRequest{Dispatcher: disp, Registration: 7})
	require.ErrorIs(t, err, messaging.ErrUnavailable)
	require.Equal(t, messaging.CodeUnavailable, messaging.CodeOf(err))

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err = cli.Remove(ctx, messaging.RemoveRequest{Dispatcher: disp, Registration: 7})
	require.ErrorIs(t, err, messaging.ErrUnavailable, "the caller's deadline too")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	proxy.Release()
}

package remote

import (
	"context"
	"fmt"
	"math"
	"net"
	"os"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// Tests against peers that lie: raw gRPC clients that send what a Client
// never would (the edge under test is the server's handling of bytes).

// serve starts a server with opts on a loopback port.
func serve(t *testing.T, opts ServerOptions) (*Server, string, *controlForTest) {
	t.Helper()
	return serveWithKnobs(t, opts, testingKnobs{})
}

// serveWithKnobs is serve with the server's testingKnobs set.
func serveWithKnobs(t *testing.T, opts ServerOptions, knobs testingKnobs) (*Server, string, *controlForTest) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cp := &controlForTest{calls: make(chan any, 16)}
	srv, err := NewServer(opts)
	require.NoError(t, err)
	srv.knobs = knobs
	require.NoError(t, srv.Start(lis, cp))
	t.Cleanup(srv.Close)
	return srv, lis.Addr().String(), cp
}

// rawConn is a plaintext gRPC connection speaking the service's codec.
func rawConn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{}), grpc.MaxCallSendMsgSize(MaxFrameBytes)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// rawStream opens a data stream and sends first as its first frame.
func rawStream(t *testing.T, conn *grpc.ClientConn, first []byte) (grpc.ClientStream, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := conn.NewStream(ctx, &grpc.StreamDesc{StreamName: "Data", ServerStreams: true, ClientStreams: true}, dataMethod)
	require.NoError(t, err)
	require.NoError(t, st.SendMsg(&frame{b: first}))
	return st, cancel
}

// refusal is the status the server ends a refused stream with.
func refusal(t *testing.T, st grpc.ClientStream) *status.Status {
	t.Helper()
	var f frame
	err := st.RecvMsg(&f)
	require.Error(t, err)
	return status.Convert(err)
}

// A hello naming a target that is not valid UTF-8 once panicked the
// service in a metric label; now the stream is refused, the service keeps
// serving, and a Send naming such a target is a typed error.
func TestHelloWithAnInvalidTargetIsRefused(t *testing.T) {
	reg := prometheus.NewRegistry()
	srv, addr, _ := serve(t, ServerOptions{Registerer: reg})
	for _, target := range []messaging.Target{"\xff\xfe", "a b", ""} {
		st, _ := rawStream(t, rawConn(t, addr), appendHello(nil, target, 16, 16))
		require.Equal(t, codes.InvalidArgument, refusal(t, st).Code(), "%q", target)
	}
	require.Equal(t, 3.0, testutil.ToFloat64(srv.met.refusedCalls.WithLabelValues("malformed")))
	require.ErrorIs(t, srv.Send("\xff\xfe", sampleMessages()[:1]), messaging.ErrUnknownTarget)
	_, err := reg.Gather()
	require.NoError(t, err, "every series is a valid one")

	cli, err := NewClient(ClientOptions{Addr: addr, Target: "c1", Capacity: 16})
	require.NoError(t, err)
	require.NoError(t, cli.Start())
	defer cli.Close()
	waitConnected(t, srv, "c1")
	require.NoError(t, srv.Send("c1", sampleMessages()[:1]))
	require.Equal(t, sampleMessages()[:1], receive(t, cli.Inbox(), 1), "the service still serves")
}

// A peer of another wire version is refused with an error naming both
// versions: on the stream, on a control call, and when the service does
// not serve this version's gRPC service at all.
func TestAnotherWireVersionIsRefusedNamingBothVersions(t *testing.T) {
	_, addr, cp := serve(t, ServerOptions{})
	conn := rawConn(t, addr)
	otherVersion := WireVersion + 1
	v2 := func(b []byte) []byte { // the same frame, another version
		out := append([]byte(wireMagic), byte(otherVersion))
		return append(out, b[len(wireMagic)+1:]...)
	}
	naming := fmt.Sprintf("wire version %d, this build %d", otherVersion, WireVersion)
	st, _ := rawStream(t, conn, v2(appendHello(nil, "c1", 16, 16)))
	s := refusal(t, st)
	require.Equal(t, codes.FailedPrecondition, s.Code())
	require.Contains(t, s.Message(), naming)

	var reply frame
	err := conn.Invoke(context.Background(), controlMethod, &frame{b: v2(appendRemove(nil, messaging.RemoveRequest{Dispatcher: disp, Registration: 7}))}, &reply)
	require.Equal(t, codes.FailedPrecondition, status.Code(err))
	require.Contains(t, status.Convert(err).Message(), naming)
	require.Empty(t, cp.calls, "nothing reached the control plane")

	// A server of another build, whose service name differs.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	other := grpc.NewServer()
	go func() { _ = other.Serve(lis) }()
	defer other.Stop()
	cli, err := NewClient(ClientOptions{Addr: lis.Addr().String(), Target: "c1"})
	require.NoError(t, err)
	require.NoError(t, cli.Start())
	defer cli.Close()
	err = cli.Remove(context.Background(), messaging.RemoveRequest{Dispatcher: disp, Registration: 7})
	require.ErrorIs(t, err, ErrVersionMismatch)
	require.ErrorIs(t, err, messaging.ErrInvalidRequest, "retrying cannot help")
	require.Contains(t, err.Error(), fmt.Sprintf("wire version %d", WireVersion))
}

// The capacity a collector announces is capped at the server's maximum: a
// greedy hello (2^32-1) cannot make the service queue every message.
func TestAnnouncedCapacityIsCappedAtTheServersMaximum(t *testing.T) {
	srv, addr, _ := serve(t, ServerOptions{MaxCapacity: 8})
	rawStream(t, rawConn(t, addr), appendHello(nil, "c1", math.MaxUint32, math.MaxUint32))
	waitConnected(t, srv, "c1")
	msgs := make([]messaging.Message, 9)
	for i := range msgs {
		msgs[i] = &messaging.Resolved{Header: hdr(1), Ts: common.Ts(i + 1)}
	}
	require.ErrorIs(t, srv.Send("c1", msgs), messaging.ErrBatchTooLarge)
	for i := range 8 {
		require.NoError(t, srv.Send("c1", msgs[i:i+1]))
	}
	require.ErrorIs(t, srv.Send("c1", msgs[:1]), messaging.ErrBusy, "the credit is the capped capacity")
}

// The server reads no control frame larger than the largest valid
// request (a full heartbeat), and that one goes through.
func TestControlFramesBeyondTheLargestValidRequestAreRefused(t *testing.T) {
	require.Less(t, maxRegisterBytes, maxUpFrameBytes)
	full := messaging.HeartbeatRequest{Checkpoints: make([]messaging.DispatcherCheckpoint, messaging.MaxHeartbeatCheckpoints)}
	for i := range full.Checkpoints {
		full.Checkpoints[i] = messaging.DispatcherCheckpoint{Dispatcher: common.DispatcherID{Hi: math.MaxUint64, Lo: math.MaxUint64},
			Registration: math.MaxUint64, Epoch: math.MaxUint64, Ts: math.MaxUint64, Slot: math.MaxUint32}
	}
	require.LessOrEqual(t, len(appendHeartbeat(nil, full)), maxUpFrameBytes)
	require.Less(t, maxUpFrameBytes, 420<<10)

	_, addr, cp := serve(t, ServerOptions{})
	var reply frame
	err := rawConn(t, addr).Invoke(context.Background(), controlMethod, &frame{b: make([]byte, maxUpFrameBytes+1)}, &reply)
	require.Equal(t, codes.ResourceExhausted, status.Code(err))

	cli, err := NewClient(ClientOptions{Addr: addr, Target: "c1"})
	require.NoError(t, err)
	require.NoError(t, cli.Start())
	defer cli.Close()
	cp.codes = make([]messaging.Code, len(full.Checkpoints))
	reply2, err := cli.Heartbeat(context.Background(), full)
	require.NoError(t, err)
	require.Len(t, reply2.Codes, messaging.MaxHeartbeatCheckpoints)
	require.Len(t, (<-cp.calls).(messaging.HeartbeatRequest).Checkpoints, messaging.MaxHeartbeatCheckpoints)
}

// Made-up targets cannot grow the server without bound: beyond MaxTargets
// a hello is refused unless a broken target's place can be taken, and the
// broken target's series go with it.
func TestMaxTargetsBoundsTheServersTargetsAndSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	srv, addr, _ := serve(t, ServerOptions{MaxTargets: 2, Registerer: reg})
	conn := rawConn(t, addr)
	_, leave1 := rawStream(t, conn, appendHello(nil, "c1", 4, 4))
	rawStream(t, conn, appendHello(nil, "c2", 4, 4))
	waitConnected(t, srv, "c1")
	waitConnected(t, srv, "c2")
	st, _ := rawStream(t, conn, appendHello(nil, "c3", 4, 4))
	require.Equal(t, codes.ResourceExhausted, refusal(t, st).Code())

	leave1() // c1's stream breaks: its place may be taken
	testwait.For(t, "one collector connected", func() bool { return srv.Connected() == 1 })
	rawStream(t, conn, appendHello(nil, "c3", 4, 4))
	waitConnected(t, srv, "c3")
	require.ErrorIs(t, srv.Send("c1", nil), messaging.ErrUnknownTarget, "c1 was dropped")
	require.Equal(t, 2, testutil.CollectAndCount(srv.met.sent, "cdcflow_remote_server_sent_messages_total"), "series of c2 and c3 only")
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				require.False(t, l.GetName() == "target" && l.GetValue() == "c1", "%s keeps a series of the dropped target", mf.GetName())
			}
		}
	}
}

// Connections beyond MaxConnections, or beyond MaxConnectionsPerIP from
// one address, are closed as they are accepted.
func TestConnectionsBeyondTheBoundsAreClosed(t *testing.T) {
	for name, opts := range map[string]ServerOptions{"total": {MaxConnections: 1}, "per IP": {MaxConnectionsPerIP: 1}} {
		t.Run(name, func(t *testing.T) {
			srv, addr, _ := serve(t, opts)
			rawStream(t, rawConn(t, addr), appendHello(nil, "c1", 4, 4))
			waitConnected(t, srv, "c1")
			c, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			defer c.Close()
			require.NoError(t, c.SetReadDeadline(time.Now().Add(30*time.Second)))
			_, err = c.Read(make([]byte, 1))
			require.Error(t, err)
			require.NotErrorIs(t, err, os.ErrDeadlineExceeded, "closed by the server, not timed out")
			require.Equal(t, 1.0, testutil.ToFloat64(srv.met.refusedConns))
			require.Equal(t, 1, srv.conns.count())
		})
	}
}

// A connection carries at most maxStreamsPerConnection streams at once:
// one more waits for a slot (here: until its deadline).
func TestStreamsPerConnectionAreBounded(t *testing.T) {
	_, addr, _ := serve(t, ServerOptions{})
	conn := rawConn(t, addr)
	for i := range maxStreamsPerConnection {
		rawStream(t, conn, appendHello(nil, messaging.Target(fmt.Sprintf("c%d", i)), 4, 4))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	var reply frame
	err := conn.Invoke(ctx, controlMethod, &frame{b: appendRemove(nil, messaging.RemoveRequest{Dispatcher: disp, Registration: 7})}, &reply)
	require.Equal(t, codes.DeadlineExceeded, status.Code(err), "no stream slot for the call")
	_, err = rawConn(t, addr).NewStream(context.Background(), &grpc.StreamDesc{StreamName: "Data", ServerStreams: true, ClientStreams: true}, dataMethod)
	require.NoError(t, err, "another connection has its own slots")
}

// A stream that never sends its hello is ended after the liveness
// timeout, so it cannot hold its slot for ever.
func TestAStreamWithoutAHelloIsEnded(t *testing.T) {
	clk := clock.NewFake(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	srv, addr, _ := serve(t, ServerOptions{Clock: clk, LivenessTimeout: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := rawConn(t, addr).NewStream(ctx, &grpc.StreamDesc{StreamName: "Data", ServerStreams: true, ClientStreams: true}, dataMethod)
	require.NoError(t, err)
	// The connection's handshake deadline is a timer of clk too, until
	// the handshake completed.
	testwait.For(t, "the handshake completed", func() bool { return srv.conns.handshakes() == 0 })
	require.NoError(t, clk.WaitWaiters(ctx, 1), "the handler waits for the hello")
	clk.Advance(time.Minute)
	require.Equal(t, codes.DeadlineExceeded, refusal(t, st).Code())
	require.Equal(t, 1.0, testutil.ToFloat64(srv.met.refusedCalls.WithLabelValues("no_hello")))
}

// Plaintext is served on loopback only, unless allowed explicitly; TLS
// needs a Policy and a Policy needs TLS.
func TestPlaintextIsServedOnLoopbackOnly(t *testing.T) {
	srv, err := NewServer(ServerOptions{})
	require.NoError(t, err)
	defer srv.Close()
	lis, err := net.Listen("tcp", "0.0.0.0:0")
	require.NoError(t, err)
	defer lis.Close()
	require.ErrorIs(t, srv.Start(lis, &controlForTest{}), messaging.ErrInvalidOptions)

	open, err := NewServer(ServerOptions{AllowInsecureListen: true})
	require.NoError(t, err)
	require.NoError(t, open.Start(lis, &controlForTest{}))
	open.Close()

	_, err = NewServer(ServerOptions{Policy: Policy{"collector-1": {"c1"}}})
	require.ErrorIs(t, err, messaging.ErrInvalidOptions, "a policy without TLS")
}

// The server's unary interceptor runs around control calls, as for a
// generated service.
func TestUnaryInterceptorRunsAroundControlCalls(t *testing.T) {
	methods := make(chan string, 4)
	_, addr, cp := serve(t, ServerOptions{UnaryInterceptor: func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		methods <- info.FullMethod
		return h(ctx, req)
	}})
	cli, err := NewClient(ClientOptions{Addr: addr, Target: "c1"})
	require.NoError(t, err)
	require.NoError(t, cli.Start())
	defer cli.Close()
	require.NoError(t, cli.Remove(context.Background(), messaging.RemoveRequest{Dispatcher: disp, Registration: 7}))
	require.Equal(t, controlMethod, <-methods)
	require.Equal(t, messaging.RemoveRequest{Dispatcher: disp, Registration: 7}, <-cp.calls)
}

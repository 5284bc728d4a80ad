package synthetic

import (
	"context"
	"flag"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/refdoc"
	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/remote"
)

var update = flag.Bool("update", false, "rewrite the generated blocks of docs/reference/ from the code")

const metricsDoc = "../../../../docs/reference/metrics.md"

// docs/reference/metrics.md lists the metric families of the synthetic
// server (role all: the event store, the service and the collectors, built
// and started as cdcserver runs them, with their dispatchers registered),
// of the transport between a service and a collector process (a
// pkg/remote server and a client connected to it, as --role service and
// --role collector run them). Each is what its registry gathers, and a family the registry describes
// but does not gather (a vector without a series: its type is unknown and
// it would be left out) fails the test. The Go runtime's and the
// process's standard families are left out.
func TestReferenceDocs(t *testing.T) {
	ours := func(name string) bool { return strings.HasPrefix(name, "cdcflow_") }
	gather := func(reg *prometheus.Registry) []refdoc.Metric {
		t.Helper()
		mfs, err := reg.Gather()
		require.NoError(t, err)
		require.Empty(t, refdoc.Unexported(reg, mfs), "families without a series: give their vectors their label values up front")
		return refdoc.Metrics(mfs, ours)
	}

	cfg := smallConfig()
	s, err := build(cfg, io.Discard)
	require.NoError(t, err)
	defer s.cleanup()
	require.NoError(t, s.start(io.Discard))
	synthetic := gather(s.reg)
	s.stop(io.Discard)
	require.Greater(t, len(synthetic), 50)
	require.NoError(t, refdoc.Sync(metricsDoc, "synthetic-metrics", refdoc.MetricTable(synthetic), *update))

	reg := prometheus.NewRegistry()
	srv, err := remote.NewServer(remote.ServerOptions{Registerer: reg})
	require.NoError(t, err)
	defer srv.Close()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	require.NoError(t, srv.Start(lis, nopControlPlane{}))
	cl, err := remote.NewClient(remote.ClientOptions{Addr: lis.Addr().String(), Target: "changefeed-1", Registerer: reg})
	require.NoError(t, err)
	defer cl.Close()
	require.NoError(t, cl.Start())
	testwait.For(t, "the client connected", func() bool { return srv.Connected() > 0 })
	transport := gather(reg)
	require.NoError(t, refdoc.Sync(metricsDoc, "remote-metrics", refdoc.MetricTable(transport), *update))

}

// nopControlPlane is a service that accepts every control call and does
// nothing: the transport's metrics need a connected collector, not a
// service.
type nopControlPlane struct{}

func (nopControlPlane) Register(context.Context, messaging.RegisterRequest) error { return nil }
func (nopControlPlane) RegisterBatch(_ context.Context, req messaging.RegisterBatchRequest) (messaging.RegisterBatchReply, error) {
	return messaging.RegisterBatchReply{Codes: make([]messaging.Code, len(req.Requests))}, nil
}
func (nopControlPlane) Reset(context.Context, messaging.ResetRequest) error   { return nil }
func (nopControlPlane) Remove(context.Context, messaging.RemoveRequest) error { return nil }
func (nopControlPlane) Heartbeat(context.Context, messaging.HeartbeatRequest) (messaging.HeartbeatReply, error) {
	return messaging.HeartbeatReply{}, nil
}

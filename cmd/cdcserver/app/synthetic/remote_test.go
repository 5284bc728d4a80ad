package synthetic

import (
	"bytes"
	"context"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/linewatch"
	"github.com/cdcflow/eventservice/internal/promrefs"
	"github.com/cdcflow/eventservice/internal/tlstest"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/remote"
)

// The service and a collector started by hand (the collector in this
// process too, but over gRPC) with mutual TLS: the service prints the
// collector's command line, the collector registers every dispatcher, the
// service asks for the collector to stop when delivery is done, then
// verifies every row and DDL from the collector's sink. Just before the
// collector stops, both /metrics endpoints are scraped: every metric the
// Grafana dashboard (deploy/grafana) names must be in one of them.
func TestServiceAndCollectorOverMutualTLS(t *testing.T) {
	ca := tlstest.NewCA(t, t.TempDir(), "node")
	svcCerts, collCerts := ca.Issue(t, "service", "service"), ca.Issue(t, "collector", "collector-1")
	cfg := smallConfig()
	cfg.Role, cfg.Listen, cfg.JSON, cfg.MetricsAddr = RoleService, "127.0.0.1:0", true, "127.0.0.1:0"
	cfg.TLSCert, cfg.TLSKey, cfg.TLSCA = svcCerts.Cert, svcCerts.Key, svcCerts.CA
	cfg.Authorize = "collector-1=*"
	collDir := t.TempDir()
	cfg.CollectorDataDirs = collDir
	stderr := linewatch.New(
		`^(?:service: listening on (\S+); .*--start-ts (\d+)|serving http://(\S+)/metrics|collector: serving .*; metrics at (\S+)|service: (delivery done))`)

	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, stopCollector := context.WithCancel(context.Background())
	defer stopCollector()
	var (
		collSum     CollectorSummary
		collErr     error
		scraped     = map[string]bool{}
		scrapeErr   error
		svcMetrics  string
		collMetrics string
	)
	wg.Go(func() {
		for {
			var m []string
			select {
			case m = <-stderr.Matches():
			case <-ctx.Done():
				return
			}
			switch {
			case m[1] != "":
				start, _ := strconv.ParseUint(m[2], 10, 64)
				c := smallConfig()
				c.Role, c.Connect, c.StartTs, c.DataDir, c.MetricsAddr = RoleCollector, m[1], start, collDir, "127.0.0.1:0"
				c.TLSCert, c.TLSKey, c.TLSCA = collCerts.Cert, collCerts.Key, collCerts.CA
				wg.Go(func() {
					var out bytes.Buffer
					collSum, collErr = RunCollector(ctx, c, &out, stderr)
				})
			case m[3] != "":
				svcMetrics = m[3]
			case m[4] != "":
				collMetrics = m[4]
			case m[5] != "":
				// Delivery is done: scrape both, then stop the collector as
				// an operator would.
				for _, addr := range []string{svcMetrics, collMetrics} {
					if scrapeErr == nil {
						scrapeErr = promrefs.Scrape(addr, scraped)
					}
				}
				stopCollector()
				return
			}
		}
	})
	var out bytes.Buffer
	sum, err := Run(context.Background(), cfg, &out, stderr)
	stopCollector()
	wg.Wait()
	require.NoError(t, err, "stderr: %s", stderr.String())
	require.NoError(t, collErr)
	require.True(t, sum.Verified, "problems: %v\nstderr: %s", sum.Problems, stderr.String())
	require.Equal(t, cfg.Changefeeds*cfg.Tables, sum.Dispatchers)
	require.Equal(t, sum.RowsUpstream, sum.RowsDelivered)
	require.Positive(t, sum.RowsUpstream)
	require.Equal(t, sum.DDLsUpstream, sum.DDLsDelivered)
	require.Equal(t, cfg.Changefeeds*cfg.Tables, collSum.Dispatchers)
	require.GreaterOrEqual(t, collSum.RowsApplied, uint64(sum.RowsDelivered))

	require.NoError(t, scrapeErr)
	require.NotEmpty(t, svcMetrics, "the service served /metrics")
	require.NotEmpty(t, collMetrics, "the collector served /metrics")
	named, err := promrefs.DashboardMetrics("../../../../deploy/grafana/cdcflow-eventservice.json")
	require.NoError(t, err)
	require.Greater(t, len(named), 20)
	for _, name := range named {
		require.True(t, scraped[name], "the dashboard names %s, which neither the service nor the collector exports", name)
	}
}

// A collector whose certificate the service's CA did not sign cannot
// reach the control plane: its calls fail as unavailable (the handshake
// is refused), and no data stream opens.
func TestCollectorWithAnUntrustedCertificateIsRefused(t *testing.T) {
	dir := t.TempDir()
	good := tlstest.NewCA(t, dir, "service").Issue(t, "service", "service")
	rogue := tlstest.NewCA(t, dir, "rogue").Issue(t, "rogue", "collector-1")
	svcTLS, err := serverTLS(Config{TLSCert: good.Cert, TLSKey: good.Key, TLSCA: good.CA}, nil)
	require.NoError(t, err)
	srv, err := remote.NewServer(remote.ServerOptions{TLS: svcTLS, Policy: remote.Policy{"collector-1": {remote.AnyTarget}}})
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	require.NoError(t, srv.Start(lis, refuseAllForTest{}))
	defer srv.Close()

	// The rogue trusts the service's CA but presents its own certificate.
	cliTLS, err := clientTLS(Config{TLSCert: rogue.Cert, TLSKey: rogue.Key, TLSCA: good.CA, Connect: lis.Addr().String()}, nil)
	require.NoError(t, err)
	cli, err := remote.NewClient(remote.ClientOptions{Addr: lis.Addr().String(), Target: "changefeed-1", TLS: cliTLS})
	require.NoError(t, err)
	require.NoError(t, cli.Start())
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = cli.Register(ctx, messaging.RegisterRequest{Dispatcher: common.DispatcherID{Lo: 1}, Registration: 1,
		Span: common.TableSpan(1), StartTs: 1, Target: "changefeed-1"})
	require.ErrorIs(t, err, messaging.ErrUnavailable)
	require.Zero(t, srv.Connected())
}

// A collector must name the service's host: with --connect :PORT the
// certificate's host check would be skipped, and any certificate of the
// CA would pass as the service.
func TestCollectorWithoutAServiceHostIsRefused(t *testing.T) {
	f := tlstest.NewCA(t, t.TempDir(), "ca").Issue(t, "collector", "collector-1")
	_, err := clientTLS(Config{TLSCert: f.Cert, TLSKey: f.Key, TLSCA: f.CA, Connect: ":7070"}, nil)
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, "names no host")
	cfg, err := clientTLS(Config{TLSCert: f.Cert, TLSKey: f.Key, TLSCA: f.CA, Connect: "127.0.0.1:7070"}, nil)
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1", cfg.ServerName)
}

// refuseAllForTest is a control plane that must never be reached.
type refuseAllForTest struct{}

func (refuseAllForTest) Register(context.Context, messaging.RegisterRequest) error {
	return messaging.ErrInternal
}
func (refuseAllForTest) Reset(context.Context, messaging.ResetRequest) error {
	return messaging.ErrInternal
}
func (refuseAllForTest) Remove(context.Context, messaging.RemoveRequest) error {
	return messaging.ErrInternal
}
func (x refuseAllForTest) RegisterBatch(ctx context.Context, r messaging.RegisterBatchRequest) (messaging.RegisterBatchReply, error) {
	return messaging.RegisterEach(ctx, x.Register, r)
}

func (refuseAllForTest) Heartbeat(context.Context, messaging.HeartbeatRequest) (messaging.HeartbeatReply, error) {
	return messaging.HeartbeatReply{}, messaging.ErrInternal
}

// The role flags are checked together with the rest.
func TestRoleFlagsAreValidated(t *testing.T) {
	c := smallConfig()
	c.Role = "sidecar"
	c.TLSCert = "x.pem"
	require.ErrorIs(t, c.Validate(), ErrInvalidConfig)
	require.ErrorContains(t, c.Validate(), "--role")
	require.ErrorContains(t, c.Validate(), "--tls-cert, --tls-key and --tls-ca go together")
	c = smallConfig()
	c.Role = RoleCollector
	c.Feeds = "1,9"
	err := c.Validate()
	for _, want := range []string{"--connect", "--data-dir", "--start-ts", "--feeds"} {
		require.ErrorContains(t, err, want)
	}
	c = smallConfig()
	c.RemoteCollectors = c.Changefeeds + 1
	require.ErrorContains(t, c.Validate(), "--remote-collectors")

	// Without TLS the service listens on loopback only, unless told.
	c = smallConfig()
	c.Role, c.Listen = RoleService, "0.0.0.0:7070"
	require.ErrorContains(t, c.Validate(), "--insecure-listen")
	c.InsecureListen = true
	require.NoError(t, c.Validate())
	c.Authorize = "collector-1=changefeed-1"
	require.ErrorContains(t, c.Validate(), "--authorize needs TLS")
	c = smallConfig()
	c.Role, c.TLSCert, c.TLSKey, c.TLSCA = RoleService, "c.pem", "k.pem", "ca.pem"
	require.ErrorContains(t, c.Validate(), "needs --authorize")
	feeds, err := parseFeeds("2, 1", 2)
	require.NoError(t, err)
	require.Equal(t, []int{2, 1}, feeds)
	_, err = parseFeeds("1,1", 2)
	require.Error(t, err)
}

// TestInjectedFaultsWrapTheGRPCTransport: with collectors in other
// processes the fault injector sits between the service and the gRPC
// server. It used to wrap the in-process transport, which such a run does
// not have, and the first send panicked on it. A send through it now
// reaches the server, which refuses a target that never connected.
func TestInjectedFaultsWrapTheGRPCTransport(t *testing.T) {
	cfg := smallConfig()
	cfg.Role, cfg.DropRate = RoleService, 1e-12 // a fault drawn about never: sends are forwarded
	var stderr bytes.Buffer
	s, err := buildWith(cfg, &stderr, runHooks{})
	require.NoError(t, err, "stderr: %s", stderr.String())
	defer s.cleanup()
	require.NotNil(t, s.faulty)
	err = s.faulty.Send("changefeed-1", []messaging.Message{&messaging.Resolved{
		Header: messaging.Header{Dispatcher: common.DispatcherIDFromUint64(1), Registration: 1, Epoch: 1, Seq: 1}, Ts: 1}})
	require.ErrorIs(t, err, messaging.ErrUnknownTarget)
}

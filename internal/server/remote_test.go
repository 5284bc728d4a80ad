package server

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/linewatch"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/remote"
)

// certsForTest writes a CA and, signed by it, a certificate and key for
// 127.0.0.1 (used by both sides: it carries server and client usages).
type certsForTest struct{ ca, cert, key string }

func newCertsForTest(t *testing.T, dir, name string) certsForTest {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name + " CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	caCert, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(key)
	require.NoError(t, err)
	c := certsForTest{ca: filepath.Join(dir, name+"-ca.pem"), cert: filepath.Join(dir, name+".pem"), key: filepath.Join(dir, name+"-key.pem")}
	for path, block := range map[string]*pem.Block{c.ca: {Type: "CERTIFICATE", Bytes: caDER},
		c.cert: {Type: "CERTIFICATE", Bytes: der}, c.key: {Type: "EC PRIVATE KEY", Bytes: keyDER}} {
		require.NoError(t, os.WriteFile(path, pem.EncodeToMemory(block), 0o600))
	}
	return c
}

// The service and a collector started by hand (the collector in this
// process too, but over gRPC) with mutual TLS: the service prints the
// collector's command line, the collector registers every dispatcher, the
// service asks for the collector to stop when delivery is done, then
// verifies every row and DDL from the collector's sink. Just before the
// collector stops, both /metrics endpoints are scraped: every metric the
// Grafana dashboard (deploy/grafana) names must be in one of them.
func TestServiceAndCollectorOverMutualTLS(t *testing.T) {
	certs := newCertsForTest(t, t.TempDir(), "node")
	cfg := smallConfig()
	cfg.Role, cfg.Listen, cfg.JSON, cfg.MetricsAddr = RoleService, "127.0.0.1:0", true, "127.0.0.1:0"
	cfg.TLSCert, cfg.TLSKey, cfg.TLSCA = certs.cert, certs.key, certs.ca
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
				c.TLSCert, c.TLSKey, c.TLSCA = certs.cert, certs.key, certs.ca
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
						scrapeErr = scrapeNames(addr, scraped)
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
	named := dashboardMetrics(t, "../../deploy/grafana/cdcflow-eventservice.json")
	require.Greater(t, len(named), 20)
	for _, name := range named {
		require.True(t, scraped[name], "the dashboard names %s, which neither the service nor the collector exports", name)
	}
}

// scrapeNames adds the metric family names served at addr/metrics to names
// (histogram and summary series under their family's name).
func scrapeNames(addr string, names map[string]bool) error {
	tr := &http.Transport{DisableKeepAlives: true} // no idle connection outlives the test (goleak)
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Get("http://" + addr + "/metrics")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	for _, line := range strings.Split(string(body), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name := line[:strings.IndexAny(line, "{ ")]
		names[familyOf(name)] = true
	}
	return nil
}

// familyOf strips a histogram's series suffix.
func familyOf(name string) string {
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			return base
		}
	}
	return name
}

// dashboardMetrics lists the metric families the dashboard's queries name.
func dashboardMetrics(t *testing.T, path string) []string {
	t.Helper()
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	require.NoError(t, json.Unmarshal(raw, &d))
	metric := regexp.MustCompile(`\b(?:cdcflow|process|go)_[a-z0-9_]+`)
	seen := map[string]bool{}
	var out []string
	for _, p := range d.Panels {
		require.NotEmpty(t, p.Targets, "panel %q has no query", p.Title)
		for _, tg := range p.Targets {
			for _, name := range metric.FindAllString(tg.Expr, -1) {
				if name = familyOf(name); !seen[name] {
					seen[name] = true
					out = append(out, name)
				}
			}
		}
	}
	return out
}

// A collector whose certificate the service's CA did not sign cannot
// reach the control plane: its calls fail as unavailable (the handshake
// is refused), and no data stream opens.
func TestCollectorWithAnUntrustedCertificateIsRefused(t *testing.T) {
	dir := t.TempDir()
	good := newCertsForTest(t, dir, "service")
	rogue := newCertsForTest(t, dir, "rogue")
	svcTLS, err := serverTLS(Config{TLSCert: good.cert, TLSKey: good.key, TLSCA: good.ca})
	require.NoError(t, err)
	srv, err := remote.NewServer(remote.ServerOptions{TLS: svcTLS})
	require.NoError(t, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	require.NoError(t, srv.Start(lis, refuseAllForTest{}))
	defer srv.Close()

	// The rogue trusts the service's CA but presents its own certificate.
	cliTLS, err := clientTLS(Config{TLSCert: rogue.cert, TLSKey: rogue.key, TLSCA: good.ca, Connect: lis.Addr().String()})
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
	feeds, err := parseFeeds("2, 1", 2)
	require.NoError(t, err)
	require.Equal(t, []int{2, 1}, feeds)
	_, err = parseFeeds("1,1", 2)
	require.Error(t, err)
}

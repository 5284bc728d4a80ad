package tests

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/cmd/cdcserver/app/synthetic"
	"github.com/cdcflow/eventservice/internal/linewatch"
	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/internal/tlstest"
)

// startCollectorProcess starts a collector process with certs, serving
// feeds of the service at addr from dir.
func startCollectorProcess(t *testing.T, addr string, startTs uint64, cfg synthetic.Config, feeds, dir string, certs tlstest.Files) *childProcess {
	t.Helper()
	args := []string{synthetic.Command, "--role", synthetic.RoleCollector, "--connect", addr, "--start-ts", strconv.FormatUint(startTs, 10),
		"--changefeeds", strconv.Itoa(cfg.Changefeeds), "--tables", strconv.Itoa(cfg.Tables), "--feeds", feeds, "--data-dir", dir,
		"--tls-cert", certs.Cert, "--tls-key", certs.Key, "--tls-ca", certs.CA, "--metrics-addr", "127.0.0.1:0", "--log-level", "warn"}
	return startChild(t, exec.Command(buildCDCServer(t), args...), linewatch.New(`^collector: serving .*; metrics at (\S+)`))
}

// With mutual TLS, a second collector holding a valid certificate (signed
// by the service's CA) for another identity tries to take changefeed 1's
// dispatchers over (its restart path: Register with Replace, after opening
// changefeed 1's data stream). The service refuses both (the identity
// collector-2 may serve changefeed-2 only): the intruder exits with a
// permission error, the owner is neither replaced nor reset, keeps
// applying rows, and at the end every row and DDL is verified from the
// owner's sink.
func TestRemoteCollectorWithAnotherIdentityCannotTakeOver(t *testing.T) {
	ca := tlstest.NewCA(t, t.TempDir(), "cluster")
	svcCerts := ca.Issue(t, "service", "service")
	ownerCerts, intruderCerts := ca.Issue(t, "collector-1", "collector-1"), ca.Issue(t, "collector-2", "collector-2")
	cfg := serverConfig(t, 100, 2000, scaled(t, 6*time.Second))
	cfg.Role, cfg.Listen, cfg.JSON, cfg.MetricsAddr = synthetic.RoleService, "127.0.0.1:0", true, "127.0.0.1:0"
	cfg.TLSCert, cfg.TLSKey, cfg.TLSCA = svcCerts.Cert, svcCerts.Key, svcCerts.CA
	cfg.Authorize = "collector-1=changefeed-1,collector-2=changefeed-2"
	ownerDir := t.TempDir()
	cfg.DataDir, cfg.CollectorDataDirs = t.TempDir(), ownerDir
	stderr := linewatch.New(`^(?:service: listening on (\S+); .*--start-ts (\d+)|serving http://(\S+)/metrics|service: (delivery done))`)

	type outcome struct {
		intruderErr      error
		intruderLog      string
		rowsBefore       float64
		rowsAfter        float64
		denied           float64
		ownerStreams     float64
		ownerStreamsLast float64
		err              error
	}
	var out outcome
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	svcMetricsAt := make(chan string, 1)
	var mu sync.Mutex // guards out.err
	fail := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if out.err == nil {
			out.err = err
		}
	}
	// attempt runs the intruder once the owner serves, and watches the
	// owner through it.
	attempt := func(addr string, start uint64, owner *childProcess) {
		var ownerMetrics string
		select {
		case mm := <-owner.stderr.Matches():
			ownerMetrics = mm[1]
		case <-owner.exited:
			fail(fmt.Errorf("the owner exited: %v: %s", owner.err, owner.stderr.String()))
			return
		case <-ctx.Done():
			return
		}
		// The baseline is the owner's first stream: its metrics line can
		// come before the stream is up (a count of 0 that later reads 1
		// with no intruder involved), so wait for it (polling a condition
		// with a deadline, not ordering).
		var err error
		testwait.Until(scaled(t, time.Minute), func() bool {
			out.ownerStreams, err = scrapeMetric(ownerMetrics, "cdcflow_remote_client_streams_total", `target="changefeed-1"`)
			return err == nil && out.ownerStreams >= 1
		})
		if err == nil && out.ownerStreams < 1 {
			err = fmt.Errorf("the owner opened no stream")
		}
		if err != nil {
			fail(err)
			return
		}
		intruder := startCollectorProcess(t, addr, start, cfg, "1", t.TempDir(), intruderCerts)
		select {
		case <-intruder.exited:
			out.intruderErr = intruder.err
		case <-ctx.Done():
			return
		}
		out.intruderLog = intruder.stderr.String()
		// The baseline is taken after the attempt: rows applied since
		// then show the owner was not stalled by it.
		out.rowsBefore, _ = scrapeMetric(ownerMetrics, "cdcflow_eventcollector_rows_applied_total", `target="changefeed-1"`)
		// The owner keeps applying rows after the attempt (polling a
		// condition with a deadline, not ordering).
		testwait.Until(scaled(t, time.Minute), func() bool {
			out.rowsAfter, _ = scrapeMetric(ownerMetrics, "cdcflow_eventcollector_rows_applied_total", `target="changefeed-1"`)
			return out.rowsAfter > out.rowsBefore
		})
		out.ownerStreamsLast, _ = scrapeMetric(ownerMetrics, "cdcflow_remote_client_streams_total", `target="changefeed-1"`)
		var svcMetrics string
		select {
		case svcMetrics = <-svcMetricsAt:
		case <-ctx.Done():
			return
		}
		if out.denied, err = scrapeMetric(svcMetrics, "cdcflow_eventservice_refused_control_requests_total", `reason="permission_denied"`); err != nil {
			fail(err)
		}
	}
	wg.Go(func() {
		var owner *childProcess
		for {
			var m []string
			select {
			case <-ctx.Done():
				return
			case m = <-stderr.Matches():
			}
			switch {
			case m[1] != "":
				start, _ := strconv.ParseUint(m[2], 10, 64)
				owner = startCollectorProcess(t, m[1], start, cfg, "1", ownerDir, ownerCerts)
				wg.Go(func() { attempt(m[1], start, owner) })
			case m[3] != "":
				svcMetricsAt <- m[3]
			case m[4] != "":
				_ = owner.cmd.Process.Signal(syscall.SIGTERM)
				_ = owner.wait() // stopped by the test
				return
			}
		}
	})
	sum := runRemote(t, context.Background(), cfg, stderr)
	cancel()
	wg.Wait()
	require.NoError(t, out.err)
	t.Logf("intruder: %v: %s", out.intruderErr, tail(out.intruderLog, 800))
	require.Error(t, out.intruderErr, "the intruder cannot serve changefeed 1")
	require.Contains(t, out.intruderLog, "permission denied", "and says why")
	require.Regexp(t, `collector-2\W+ may not (take over|register|serve)`, out.intruderLog, "naming its identity")
	require.Positive(t, out.denied, "the service refused its takeover")
	require.Greater(t, out.rowsAfter, out.rowsBefore, "the owner kept applying rows")
	require.Equal(t, out.ownerStreams, out.ownerStreamsLast, "the owner's stream was never replaced")
	requireDelivered(t, sum, cfg.Tables)
	require.Zero(t, sum.Resets, "nothing the intruder did reset the owner's dispatchers")
}

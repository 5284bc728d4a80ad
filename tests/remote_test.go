package tests

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/cmd/cdcserver/app/synthetic"
	"github.com/cdcflow/eventservice/internal/faultproxy"
	"github.com/cdcflow/eventservice/internal/linewatch"
)

// The multi-process tests run the service in the test process (under the
// race detector, with goleak at the end) and its collectors as real
// cdcserver processes built once per test binary.

var cdcserverBin struct {
	once sync.Once
	path string
	err  error
	out  []byte
}

// buildCDCServer builds cmd/cdcserver into a temporary directory, once.
func buildCDCServer(t testing.TB) string {
	t.Helper()
	cdcserverBin.once.Do(func() {
		goTool, err := exec.LookPath("go")
		if err != nil {
			goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
		}
		dir, err := os.MkdirTemp("", "cdcserver-bin-")
		if err != nil {
			cdcserverBin.err = err
			return
		}
		cdcserverBin.path = filepath.Join(dir, "cdcserver")
		cmd := exec.Command(goTool, "build", "-o", cdcserverBin.path, "github.com/cdcflow/eventservice/cmd/cdcserver")
		cdcserverBin.out, cdcserverBin.err = cmd.CombinedOutput()
	})
	require.NoError(t, cdcserverBin.err, "go build cmd/cdcserver: %s", cdcserverBin.out)
	return cdcserverBin.path
}

// remoteConfig is a service with n collector processes.
func remoteConfig(t *testing.T, changefeeds, collectors, tables, rate int, d time.Duration) synthetic.Config {
	cfg := serverConfig(t, tables, rate, d)
	cfg.Changefeeds, cfg.RemoteCollectors = changefeeds, collectors
	cfg.Executable = buildCDCServer(t)
	cfg.DataDir, cfg.JSON = t.TempDir(), true
	return cfg
}

// runRemote runs the service until it returns, with stderr watched.
func runRemote(t *testing.T, ctx context.Context, cfg synthetic.Config, stderr *linewatch.Watcher) synthetic.Summary {
	t.Helper()
	var out bytes.Buffer
	sum, err := synthetic.Run(ctx, cfg, &out, stderr)
	require.NoError(t, err, "stderr: %s", tail(stderr.String(), 4000))
	t.Logf("summary: %s", out.String())
	if !sum.Verified {
		t.Logf("stderr tail: %s", tail(stderr.String(), 4000))
	}
	return sum
}

// One service, two collector processes (a changefeed each) over gRPC on
// loopback: every row and DDL of both changefeeds verified from the
// collectors' durable sinks, nothing lost, nothing twice, and both
// collectors stopped cleanly and reported what they applied.
func TestRemoteCollectorsDeliverEverything(t *testing.T) {
	cfg := remoteConfig(t, 2, 2, 200, 4000, scaled(t, 3*time.Second))
	cfg.DDLInterval = 200 * time.Millisecond
	stderr := linewatch.New(`^collector (\d+) started: pid (\d+)`)
	sum := runRemote(t, context.Background(), cfg, stderr)
	requireDelivered(t, sum, 2*cfg.Tables)
	require.Equal(t, synthetic.RoleService, sum.Role)
	require.Positive(t, sum.DDLsDelivered, "DDLs recorded by the durable sinks and verified")
	require.GreaterOrEqual(t, sum.RowsApplied, uint64(sum.RowsDelivered), "the collectors' own count of rows applied")
	require.Zero(t, sum.CollectorRestarts)
	started := map[string]bool{}
	for len(started) < 2 {
		select {
		case m := <-stderr.Matches():
			started[m[1]] = true
		default:
			t.Fatalf("collector processes started: %v; stderr: %s", started, tail(stderr.String(), 2000))
		}
	}
}

// A collector process killed with SIGKILL mid-run is started again on its
// data dir by the service and resumes from its sinks' checkpoints, taking
// its dispatchers over at the service under new registrations: at the end
// every row is in the sinks exactly once (the sink applies versions
// idempotently and the verifier checks per-key order by application
// sequence), nothing is missing, the DDLs are as scheduled.
func TestRemoteCollectorKilledAndRestarted(t *testing.T) {
	cfg := remoteConfig(t, 2, 2, 200, 4000, scaled(t, 4*time.Second))
	cfg.DDLInterval = 200 * time.Millisecond
	stderr := linewatch.New(`^collector (\d+) started: pid (\d+)`)
	killed := make(chan int, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wg.Go(func() {
		for {
			var m []string
			select {
			case <-ctx.Done():
				return
			case m = <-stderr.Matches():
			}
			if m[1] != "1" {
				continue
			}
			pid, _ := strconv.Atoi(m[2])
			// Fault injection at a point in the run, not synchronisation:
			// any moment is a valid one to crash at.
			timer := time.NewTimer(cfg.Duration / 3)
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-timer.C:
			}
			if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
				killed <- pid
			}
			return
		}
	})
	sum := runRemote(t, context.Background(), cfg, stderr)
	cancel()
	wg.Wait()
	select {
	case <-killed:
	default:
		t.Fatalf("collector 1 was never killed; stderr: %s", tail(stderr.String(), 2000))
	}
	requireDelivered(t, sum, 2*cfg.Tables)
	require.Equal(t, 1, sum.CollectorRestarts, "the killed collector was started again")
}

// Shutting the service down (SIGINT: the caller's context) while its
// collector processes are connected is bounded: the upstream stops,
// delivery drains, the collectors are stopped, what was produced is
// verified, and no goroutine survives (goleak in TestMain).
func TestRemoteShutdownIsBounded(t *testing.T) {
	cfg := remoteConfig(t, 2, 2, 100, 2000, time.Hour)
	stderr := linewatch.New(`^\s*\d+\.\ds/`) // a progress line: the run is under way
	cfg.ProgressInterval = 100 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		select {
		case <-stderr.Matches():
		case <-ctx.Done():
		}
		cancel()
	})
	start := time.Now()
	sum := runRemote(t, ctx, cfg, stderr)
	took := time.Since(start)
	require.True(t, sum.Interrupted)
	require.True(t, sum.Verified, "what was produced before the interrupt is delivered: %v", sum.Problems)
	require.Less(t, took, scaled(t, 2*time.Minute), "shutdown with collectors connected is bounded")
}

// freeLoopbackAddr returns a loopback address nobody listens on (the
// service listens there; the proxies must know it before it starts).
func freeLoopbackAddr(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

// scrapeMetric returns the value of the series of name whose labels
// contain label, from addr/metrics. It may run off the test's goroutine.
func scrapeMetric(addr, name, label string) (float64, error) {
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+"{") && strings.Contains(line, label) {
			return strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		}
	}
	return 0, fmt.Errorf("%s{%s} not served at %s", name, label, addr)
}

// Collector 1 reaches the service through a fault proxy, collector 2
// directly. On collector 1's link, in turn: latency, a stall (collector 1
// stops reading: the service's stream to it backs up while its credit
// runs out), a connection reset, and a 2 s partition. Meanwhile collector
// 2 keeps applying rows and its checkpoint lag stays below the partition's
// length, the store's notify callback never waits on the sick link (its
// max stays far below the stall), and once the link heals every row and
// DDL of both changefeeds is delivered, nothing twice.
func TestRemoteCollectorBehindAFaultyLink(t *testing.T) {
	cfg := remoteConfig(t, 2, 2, 100, 2000, scaled(t, 8*time.Second))
	cfg.DDLInterval = 300 * time.Millisecond
	cfg.Listen = freeLoopbackAddr(t)
	cfg.MetricsAddr = "127.0.0.1:0"
	sick := faultproxy.Start(t, cfg.Listen)
	cfg.CollectorConnect = sick.Addr + "," + cfg.Listen
	stderr := linewatch.New(`^collector: serving changefeeds \[(\d+)\] .*; metrics at (\S+)`)

	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var healthy string // collector 2's metrics address
	type observation struct {
		rowsBefore, rowsAfter float64
		lagAfter              float64
		err                   error
	}
	var obs observation
	wg.Go(func() {
		for healthy == "" {
			select {
			case <-ctx.Done():
				return
			case m := <-stderr.Matches():
				if m[1] == "2" {
					healthy = m[2]
				}
			}
		}
		// Fault injection at points of the run, not synchronisation: the
		// upstream runs for cfg.Duration whatever happens here.
		pause := func(d time.Duration) bool {
			timer := time.NewTimer(d)
			defer timer.Stop()
			select {
			case <-ctx.Done():
				return false
			case <-timer.C:
				return true
			}
		}
		sick.SetDelay(5 * time.Millisecond)
		if !pause(time.Second) {
			return
		}
		sick.SetDelay(0)
		sick.Hold(faultproxy.Downstream) // collector 1 stops reading
		if !pause(time.Second) {
			return
		}
		sick.Release()
		sick.Reset()
		if !pause(500 * time.Millisecond) {
			return
		}
		scrape := func(name string) float64 {
			v, err := scrapeMetric(healthy, name, `target="changefeed-2"`)
			if err != nil && obs.err == nil {
				obs.err = err
			}
			return v
		}
		obs.rowsBefore = scrape("cdcflow_eventcollector_rows_applied_total")
		sick.Partition()
		if !pause(2 * time.Second) {
			return
		}
		obs.rowsAfter = scrape("cdcflow_eventcollector_rows_applied_total")
		obs.lagAfter = scrape("cdcflow_eventcollector_checkpoint_lag_seconds")
		sick.Heal()
	})
	sum := runRemote(t, context.Background(), cfg, stderr)
	cancel()
	wg.Wait()
	require.NotEmpty(t, healthy, "collector 2 never served its metrics")
	require.NoError(t, obs.err)
	requireDelivered(t, sum, 2*cfg.Tables)
	require.Positive(t, sum.Reconnects, "collector 1 reconnected after the reset and the partition")
	require.GreaterOrEqual(t, sum.Reregistered, int64(cfg.Tables), "after a reconnect every dispatcher of the feed registered again")
	require.Greater(t, obs.rowsAfter, obs.rowsBefore, "collector 2 kept applying rows while collector 1 was partitioned")
	require.Less(t, obs.lagAfter, 2.0, "collector 2's checkpoint lag stayed below the partition's length")
	// The notify callback only marks work: a blocked send would show here
	// as seconds (the stall and the partition last 1 s and 2 s).
	require.Less(t, sum.NotifyNs.Max, float64(500*time.Millisecond), "the store's notify path waited on the sick link")
}

package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/linewatch"
	"github.com/cdcflow/eventservice/internal/pgtest"
	"github.com/cdcflow/eventservice/internal/testwait"
)

// Environment variables of BenchmarkNodeMemory (defaults in
// nodeMemoryLoad).
const (
	// envNodeMemRate is each changefeed's insert rate, rows/s.
	envNodeMemRate = "CDCFLOW_NODEMEM_RATE"
	// envNodeMemSeconds is how long the load lasts.
	envNodeMemSeconds = "CDCFLOW_NODEMEM_SECONDS"
	// envNodeMemBacklog is the rows of each changefeed's backlog.
	envNodeMemBacklog = "CDCFLOW_NODEMEM_BACKLOG"
	// envNodeMemFlags are more flags of the node, space-separated.
	envNodeMemFlags = "CDCFLOW_NODEMEM_FLAGS"
	// envNodeMemRowBytes: the size of a row's value (default
	// nodeMemoryRowBytes).
	envNodeMemRowBytes = "CDCFLOW_NODEMEM_ROW_BYTES"
)

// nodeMemoryRowBytes is the size of a row's text value, unless
// CDCFLOW_NODEMEM_ROW_BYTES says.
const nodeMemoryRowBytes = 1000

// BenchmarkNodeMemory measures what a changefeed costs the resident memory
// of the node that runs it: one `cdcserver server` process (its embedded
// etcd) runs K changefeeds between a source and a target PostgreSQL 15,
// each of its own table (--include), slot and publication (its name) and
// target database. The node's VmRSS (/proc/<pid>/status) is read with no
// changefeed (base-MiB), once all K replicate and are idle, and every
// 250 ms while each table takes a steady insert load and then a backlog
// (one INSERT ... SELECT of many rows, which the source decodes faster
// than the target applies, so that rows are read back from the event
// store); VmHWM at the end. Each is reported per changefeed: what the
// node holds above its base, divided by K (idle-MiB/cf, load-MiB/cf,
// hwm-MiB/cf). The rows are 1 kB (CDCFLOW_NODEMEM_ROW_BYTES: wide rows,
// 65536 with a rate of 20 and a backlog of 2000, say, whose values the
// source TOASTs); CDCFLOW_NODEMEM_RATE (rows/s per
// changefeed, default 500), CDCFLOW_NODEMEM_SECONDS (default 20),
// CDCFLOW_NODEMEM_BACKLOG (rows per changefeed, default 50000) and
// CDCFLOW_NODEMEM_FLAGS (more flags of the node) change the load. One
// measurement per run, whatever b.N: run it with -benchtime 1x.
func BenchmarkNodeMemory(b *testing.B) {
	for _, k := range []int{1, 8} {
		b.Run(fmt.Sprintf("changefeeds=%d", k), func(b *testing.B) { benchNodeMemory(b, k) })
	}
}

// nodeMemoryLoad is the load of each changefeed.
type nodeMemoryLoad struct {
	rate     int           // rows/s
	duration time.Duration // of the steady load
	backlog  int           // rows of the backlog
}

func benchNodeMemory(b *testing.B, k int) {
	load := nodeMemoryLoad{rate: int(envUint(b, envNodeMemRate, 500)), duration: time.Duration(envUint(b, envNodeMemSeconds, 20)) * time.Second,
		backlog: int(envUint(b, envNodeMemBacklog, 50000))}
	rowBytes := int(envUint(b, envNodeMemRowBytes, nodeMemoryRowBytes))
	ctx := context.Background()
	// Each changefeed holds a walsender and its stream on the source, and
	// its sink's lanes, fence and positions on the target.
	src := pgtest.StartWith(b, pgtest.Options{Logical: true, Settings: []string{"max_connections=200", "max_wal_senders=64", "max_replication_slots=32"}})
	dst := pgtest.StartWith(b, pgtest.Options{Settings: []string{"max_connections=200"}})
	srcConn, err := pgx.Connect(ctx, src.DSN)
	require.NoError(b, err)
	defer srcConn.Close(ctx)
	dstConn, err := pgx.Connect(ctx, dst.DSN)
	require.NoError(b, err)
	defer dstConn.Close(ctx)
	for i := range k {
		_, err := srcConn.Exec(ctx, fmt.Sprintf("CREATE TABLE t%d (id bigint PRIMARY KEY, v text); INSERT INTO t%[1]d SELECT g, repeat('v', %d) FROM generate_series(1, 100) g",
			i, rowBytes))
		require.NoError(b, err)
		_, err = dstConn.Exec(ctx, fmt.Sprintf("CREATE DATABASE cf%d", i))
		require.NoError(b, err)
	}

	addr, etcdClient, etcdPeer := freeLoopbackAddr(b), freeLoopbackAddr(b), freeLoopbackAddr(b)
	args := []string{"server", "--node-id", "n1", "--addr", addr, "--data-dir", b.TempDir(), "--etcd-client-addr", etcdClient,
		"--etcd-peer-addr", etcdPeer, "--balance-interval", "1h", "--log-level", "warn"}
	args = append(args, strings.Fields(os.Getenv(envNodeMemFlags))...)
	node := startChild(b, exec.Command(buildCDCServer(b), args...), linewatch.New(`^server: node`))
	b.Cleanup(func() {
		if b.Failed() {
			b.Log(node.stderr.String())
		}
	})
	pid := node.cmd.Process.Pid
	testwait.Within(b, time.Minute, "the node ready", func() bool {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	settle := func() { time.Sleep(5 * time.Second) } // a measurement's cadence: the Go collector's cycles and pebble's flushes settle
	settle()
	base := mustProcStatusKiB(b, pid, "VmRSS")

	for i := range k {
		body, err := json.Marshal(map[string]any{"name": fmt.Sprintf("cf%d", i), "config": map[string]any{"source": src.DSN,
			"sink": dst.DSNFor(fmt.Sprintf("cf%d", i)), "include": []string{fmt.Sprintf("public.t%d", i)}}})
		require.NoError(b, err)
		resp, err := http.Post("http://"+addr+"/api/v1/changefeeds", "application/json", bytes.NewReader(body))
		require.NoError(b, err)
		resp.Body.Close()
		require.Equal(b, http.StatusCreated, resp.StatusCode)
	}
	targets := make([]*pgx.Conn, k)
	for i := range k {
		targets[i], err = pgx.Connect(ctx, dst.DSNFor(fmt.Sprintf("cf%d", i)))
		require.NoError(b, err)
		defer targets[i].Close(ctx)
	}
	caughtUp := func(what string, within time.Duration) {
		b.Helper()
		testwait.Within(b, within, what, func() bool {
			for i := range k {
				var want, got int64
				if srcConn.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM t%d", i)).Scan(&want) != nil ||
					targets[i].QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM t%d", i)).Scan(&got) != nil || got != want {
					return false
				}
			}
			return true
		})
	}
	caughtUp("every changefeed's snapshot applied", 3*time.Minute)
	settle()
	idle := mustProcStatusKiB(b, pid, "VmRSS")

	// The load: each table's rows come in a transaction every 100 ms
	// (rate/10 rows each), from a connection of its own; the node's RSS
	// is sampled meanwhile, then through the backlog until every target
	// holds every row.
	// At the peak: the Go heap in use, and what the Go runtime holds from
	// the OS (its sys less what it released): the rest of the RSS is
	// outside Go (pebble's caches and memtables, cgo).
	peak, heapAtPeak, goAtPeak := idle, int64(0), int64(0)
	stopSampling := make(chan struct{})
	var sampling sync.WaitGroup
	sampling.Go(func() {
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-tick.C:
				if rss, err := procStatusKiB(pid, "VmRSS"); err == nil && rss > peak {
					peak = rss
					g, _ := scrapeGauges(addr, "go_memstats_heap_inuse_bytes", "go_memstats_sys_bytes", "go_memstats_heap_released_bytes")
					heapAtPeak, goAtPeak = g[0], g[1]-g[2]
				}
			}
		}
	})
	began := time.Now()
	var loaders sync.WaitGroup
	errs := make([]error, k)
	for i := range k {
		loaders.Go(func() {
			conn, err := pgx.Connect(ctx, src.DSN)
			if err != nil {
				errs[i] = err
				return
			}
			defer conn.Close(ctx)
			next, per := int64(1_000_000), max(1, load.rate/10)
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for time.Since(began) < load.duration {
				<-tick.C
				if _, err := conn.Exec(ctx, fmt.Sprintf("INSERT INTO t%d SELECT g, repeat(md5(g::text), %d) FROM generate_series(%d, %d) g",
					i, rowBytes/32, next, next+int64(per)-1)); err != nil {
					errs[i] = err
					return
				}
				next += int64(per)
			}
			if load.backlog > 0 {
				_, errs[i] = conn.Exec(ctx, fmt.Sprintf("INSERT INTO t%d SELECT g, repeat(md5(g::text), %d) FROM generate_series(%d, %d) g",
					i, rowBytes/32, 10_000_000, 10_000_000+load.backlog-1))
			}
		})
	}
	loaders.Wait()
	for _, err := range errs {
		require.NoError(b, err)
	}
	caughtUp("every changefeed caught up with the load", 10*time.Minute)
	close(stopSampling)
	sampling.Wait()
	hwm := mustProcStatusKiB(b, pid, "VmHWM")
	mib := func(kib int64) float64 { return float64(kib) / 1024 }
	b.ReportMetric(mib(base), "base-MiB")
	b.ReportMetric(mib(idle-base)/float64(k), "idle-MiB/cf")
	b.ReportMetric(mib(peak-base)/float64(k), "load-MiB/cf")
	b.ReportMetric(mib(hwm-base)/float64(k), "hwm-MiB/cf")
	b.ReportMetric(time.Since(began).Seconds(), "load-s")
	b.Logf("K=%d: RSS base %.0f MiB, idle %.0f MiB, under load up to %.0f MiB (then the Go heap in use %.0f MiB, the Go runtime's %.0f MiB, outside Go %.0f MiB), VmHWM %.0f MiB (%d rows/s each for %v, then %d rows each, caught up %.1f s after the start)",
		k, mib(base), mib(idle), mib(peak), float64(heapAtPeak)/(1<<20), float64(goAtPeak)/(1<<20), mib(peak)-float64(goAtPeak)/(1<<20), mib(hwm),
		load.rate, load.duration, load.backlog, time.Since(began).Seconds())
}

// procStatusKiB is field (VmRSS, VmHWM) of /proc/<pid>/status, in KiB.
func procStatusKiB(pid int, field string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			return strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%d/status: no %s", pid, field)
}

func mustProcStatusKiB(t testing.TB, pid int, field string) int64 {
	t.Helper()
	n, err := procStatusKiB(pid, field)
	require.NoError(t, err)
	return n
}

// scrapeGauges are the values of the unlabelled series names at
// addr/metrics, in order.
func scrapeGauges(addr string, names ...string) ([]int64, error) {
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := make([]int64, len(names))
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		for i, name := range names {
			if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					return nil, err
				}
				out[i] = int64(f)
			}
		}
	}
	return out, sc.Err()
}

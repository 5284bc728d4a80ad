package node

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/cdcflow/eventservice/cmd/cdcserver/app/replicate"
	"github.com/cdcflow/eventservice/internal/pgtest"
	"github.com/cdcflow/eventservice/internal/promrefs"
	"github.com/cdcflow/eventservice/internal/refdoc"
	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/cluster"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
		goleak.IgnoreAnyFunction("go.opencensus.io/stats/view.(*worker).start"))
}

// syncBuffer is a node's stderr, read by the test while the node writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testNode is a node run in the test's process.
type testNode struct {
	id     string
	addr   string
	stop   context.CancelFunc
	done   chan error
	stderr *syncBuffer
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

// startNode runs node id; etcd "" starts the embedded member (whose
// client URL is returned too).
func startNode(t *testing.T, id, etcd string) (*testNode, string) {
	t.Helper()
	n, client := launchNode(t, id, etcd, nil)
	testwait.Within(t, time.Minute, id+" ready", func() bool {
		resp, err := http.Get("http://" + n.addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return n, client
}

// launchNode starts node id with its configuration tweaked (nil: none),
// without waiting for it.
func launchNode(t *testing.T, id, etcd string, tweak func(*Config)) (*testNode, string) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.NodeID, cfg.Addr, cfg.DataDir, cfg.Etcd = id, freeAddr(t), t.TempDir(), etcd
	cfg.LeaseTTL, cfg.BalanceInterval, cfg.DrainTimeout, cfg.LogLevel = 3*time.Second, time.Hour, time.Minute, "warn"
	client := ""
	if etcd == "" {
		cfg.EtcdClientAddr, cfg.EtcdPeerAddr = freeAddr(t), freeAddr(t)
		client = "http://" + cfg.EtcdClientAddr
	}
	if tweak != nil {
		tweak(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &testNode{id: id, addr: cfg.Addr, stop: cancel, done: make(chan error, 1), stderr: &syncBuffer{}}
	go func() { n.done <- Run(ctx, cfg, n.stderr) }()
	return n, client
}

// call calls the API of n: method, path, a body (nil: none), and decodes
// the reply into out (nil: not); it returns the status.
func (n *testNode) call(t *testing.T, method, path string, body, out any) int {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, "http://"+n.addr+path, r)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	if out != nil && resp.StatusCode < 300 {
		require.NoError(t, json.Unmarshal(b, out), string(b))
	}
	return resp.StatusCode
}

// runsOn returns the node changefeed name is assigned to ("" none).
func (n *testNode) runsOn(t *testing.T, name string) string {
	var v queryResponse
	if n.call(t, "GET", "/api/v1/changefeeds/"+name+"?status=false", nil, &v) != http.StatusOK || v.Assignment == nil {
		return ""
	}
	return v.Assignment.Node
}

// A two-node cluster, one with the embedded etcd and one joined to it,
// runs a changefeed created through the API: the target is equal to the
// source; a drain of its node moves it to the other, which goes on from
// the checkpoints (equal again, after more rows); pause takes it off every
// node, resume places it again; remove drops its slot and its keys, and a
// password in a DSN is refused.
func TestATwoNodeClusterRunsMovesPausesAndRemovesAChangefeed(t *testing.T) {
	src := pgtest.StartWith(t, pgtest.Options{Logical: true})
	dst := pgtest.Start(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, src.DSN)
	require.NoError(t, err)
	defer conn.Close(ctx)
	exec := func(q string) {
		_, err := conn.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	exec("CREATE TABLE t (id int PRIMARY KEY, v text)")
	exec("INSERT INTO t SELECT g, 'v' FROM generate_series(1, 100) g")

	n1, etcd := startNode(t, "n1", "")
	n2, _ := startNode(t, "n2", etcd)
	nodes := map[string]*testNode{"n1": n1, "n2": n2}
	defer func() {
		for _, n := range []*testNode{n2, n1} { // n1 holds the embedded etcd: last
			n.stop()
			require.NoError(t, <-n.done, n.stderr.String())
		}
	}()

	require.Equal(t, http.StatusBadRequest, n1.call(t, "POST", "/api/v1/changefeeds", createRequest{Name: "cf",
		Config: ChangefeedConfig{Source: strings.Replace(src.DSN, "postgres@", "postgres:secret@", 1), Sink: dst.DSN}}, nil), "a password in clear")
	require.Equal(t, http.StatusCreated, n1.call(t, "POST", "/api/v1/changefeeds", createRequest{Name: "cf",
		Config: ChangefeedConfig{Source: src.DSN, Sink: dst.DSN}}, nil))
	require.Equal(t, http.StatusConflict, n2.call(t, "POST", "/api/v1/changefeeds", createRequest{Name: "cf",
		Config: ChangefeedConfig{Source: src.DSN, Sink: dst.DSN}}, nil), "the name is taken")
	equal := func(what string) {
		t.Helper()
		var out bytes.Buffer
		var err error
		if !testwait.Until(2*time.Minute, func() bool {
			out.Reset()
			err = replicate.Compare(ctx, src.DSN, dst.DSN, "cf", &out)
			return err == nil
		}) {
			t.Fatalf("%s: never equal: %v\n%s\nn1: %s\nn2: %s", what, err, out.String(), n1.stderr.String(), n2.stderr.String())
		}
	}
	equal("the snapshot")
	// Drained before its snapshot is recorded as applied, a changefeed
	// starts over on the next node, copying every table again (by design).
	testwait.Within(t, time.Minute, "the snapshot recorded as applied", func() bool {
		var q queryResponse
		return n1.call(t, "GET", "/api/v1/changefeeds/cf", nil, &q) == http.StatusOK && q.Status != nil && q.Status.Snapshot == "applied"
	})
	first := n1.runsOn(t, "cf")
	require.Contains(t, []string{"n1", "n2"}, first)
	other := map[string]string{"n1": "n2", "n2": "n1"}[first]

	var listed []cluster.NodeView
	require.Equal(t, http.StatusOK, n2.call(t, "GET", "/api/v1/nodes", nil, &listed))
	require.Len(t, listed, 2)

	require.Equal(t, http.StatusOK, n2.call(t, "POST", "/api/v1/nodes/"+first+"/drain", nil, nil))
	testwait.Within(t, time.Minute, "moved off the drained node", func() bool { return n1.runsOn(t, "cf") == other })
	exec("INSERT INTO t SELECT g, 'after the move' FROM generate_series(101, 150) g")
	exec("UPDATE t SET v = 'updated' WHERE id <= 10")
	equal("after the move")
	var q queryResponse
	require.Equal(t, http.StatusOK, nodes[other].call(t, "GET", "/api/v1/changefeeds/cf", nil, &q))
	require.NotNil(t, q.Status, q.StatusError)
	require.Equal(t, "applied", q.Status.Snapshot)
	require.GreaterOrEqual(t, len(q.Assignment.History), 2, "placed, then moved")
	last := q.Assignment.History[len(q.Assignment.History)-1]
	require.Equal(t, cluster.Move{From: first, To: other, At: last.At, Why: cluster.ReasonDrain}, last)

	require.Equal(t, http.StatusOK, n1.call(t, "POST", "/api/v1/changefeeds/cf/pause", nil, nil))
	testwait.Within(t, time.Minute, "paused: on no node", func() bool { return n1.runsOn(t, "cf") == "" })
	var active bool
	testwait.Within(t, time.Minute, "the slot's walsender released", func() bool {
		require.NoError(t, conn.QueryRow(ctx, "SELECT active FROM pg_replication_slots WHERE slot_name = 'cf'").Scan(&active))
		return !active
	})
	require.Equal(t, http.StatusOK, n1.call(t, "POST", "/api/v1/changefeeds/cf/resume", nil, nil))
	testwait.Within(t, time.Minute, "resumed on the node not draining", func() bool { return n1.runsOn(t, "cf") == other })
	exec("DELETE FROM t WHERE id > 140")
	equal("after the resume")

	require.Equal(t, http.StatusOK, n2.call(t, "DELETE", "/api/v1/changefeeds/cf", nil, nil))
	require.Equal(t, http.StatusNotFound, n1.call(t, "GET", "/api/v1/changefeeds/cf", nil, nil))
	var slots int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'cf'").Scan(&slots))
	require.Zero(t, slots, "the slot dropped")
}

// The cluster's dashboard (deploy/grafana/cdcflow-cluster.json) and alert
// rules (deploy/prometheus/cdcflow-cluster-alerts.yml) name only metrics a
// node exports: a node runs a changefeed between two real servers, and
// every metric family they name is in its /metrics.
func TestTheClusterDashboardAndAlertsNameServedMetrics(t *testing.T) {
	dashboard, err := promrefs.DashboardMetrics("../../../../deploy/grafana/cdcflow-cluster.json")
	require.NoError(t, err)
	rules, err := promrefs.RuleMetrics("../../../../deploy/prometheus/cdcflow-cluster-alerts.yml")
	require.NoError(t, err)
	require.Greater(t, len(dashboard), 8)
	require.Greater(t, len(rules), 4)
	src := pgtest.StartWith(t, pgtest.Options{Logical: true})
	dst := pgtest.Start(t)
	n1, _ := startNode(t, "n1", "")
	defer func() {
		n1.stop()
		require.NoError(t, <-n1.done, n1.stderr.String())
	}()
	require.Equal(t, http.StatusCreated, n1.call(t, "POST", "/api/v1/changefeeds", createRequest{Name: "cf",
		Config: ChangefeedConfig{Source: src.DSN, Sink: dst.DSN}}, nil))
	var missing []string
	testwait.Until(time.Minute, func() bool { // the assertion below names what is missing
		scraped := map[string]bool{}
		require.NoError(t, promrefs.Scrape(n1.addr, scraped))
		missing = missing[:0]
		for _, name := range append(dashboard, rules...) {
			if !scraped[name] && !slices.Contains(missing, name) {
				missing = append(missing, name)
			}
		}
		return len(missing) == 0
	})
	require.Empty(t, missing, "named by the cluster's dashboard or alerts, and not exported by a node")

	// The reference of the cluster's own families (a changefeed's are
	// serve's, documented with serve's).
	mfs, err := refdoc.Scrape(n1.addr)
	require.NoError(t, err)
	ms := refdoc.Metrics(mfs, func(name string) bool { return strings.HasPrefix(name, "cdcflow_cluster_") })
	require.GreaterOrEqual(t, len(ms), 10, "the cluster's families")
	require.NoError(t, refdoc.Sync("../../../../docs/reference/metrics.md", "cluster-metrics", refdoc.MetricTable(ms), *update))
}

var update = flag.Bool("update", false, "rewrite the generated blocks of docs/reference/ from the code")

// Changefeeds of one node are isolated: one that cannot start (its target
// database does not exist) is started again and again after its back-off,
// counted, while another on the same node replicates.
func TestAFailingChangefeedNeverStopsAnotherOnItsNode(t *testing.T) {
	src := pgtest.StartWith(t, pgtest.Options{Logical: true})
	dst := pgtest.Start(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, src.DSN)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "CREATE TABLE t (id int PRIMARY KEY, v text); INSERT INTO t SELECT g, 'v' FROM generate_series(1, 50) g")
	require.NoError(t, err)
	n1, _ := startNode(t, "n1", "")
	defer func() {
		n1.stop()
		require.NoError(t, <-n1.done, n1.stderr.String())
	}()
	require.Equal(t, http.StatusCreated, n1.call(t, "POST", "/api/v1/changefeeds", createRequest{Name: "bad",
		Config: ChangefeedConfig{Source: src.DSN, Sink: dst.DSNFor("nope")}}, nil))
	require.Equal(t, http.StatusCreated, n1.call(t, "POST", "/api/v1/changefeeds", createRequest{Name: "good",
		Config: ChangefeedConfig{Source: src.DSN, Sink: dst.DSN}}, nil))
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(n1.stderr.String())
		}
	})
	testwait.Within(t, 2*time.Minute, "bad started again at least once", func() bool {
		return strings.Contains(n1.stderr.String(), "the changefeed stopped: starting it again") &&
			strings.Contains(n1.stderr.String(), "nope")
	})
	var out bytes.Buffer
	require.True(t, testwait.Until(2*time.Minute, func() bool {
		out.Reset()
		return replicate.Compare(ctx, src.DSN, dst.DSN, "good", &out) == nil
	}), "good never equal: %s", out.String())
	_, err = conn.Exec(ctx, "INSERT INTO t VALUES (51, 'after')")
	require.NoError(t, err)
	require.True(t, testwait.Until(2*time.Minute, func() bool {
		out.Reset()
		return replicate.Compare(ctx, src.DSN, dst.DSN, "good", &out) == nil
	}), "good never equal after more rows: %s", out.String())
	scraped := map[string]bool{}
	require.NoError(t, promrefs.Scrape(n1.addr, scraped))
	require.True(t, scraped["cdcflow_cluster_changefeed_restarts_total"])
	require.True(t, scraped["cdcflow_cluster_store_cache_bytes"], "the shared block cache's gauge")
}

package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/cmd/cdcserver/app/node"
	"github.com/cdcflow/eventservice/internal/faultproxy"
	"github.com/cdcflow/eventservice/internal/linewatch"
	"github.com/cdcflow/eventservice/internal/pgtest"
	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/cluster"
)

// clusterHarness is a cluster on one machine, as the fault tests run it:
// three embedded etcd members on loopback (in the test's process), a
// source and a target PostgreSQL, and cdcserver server nodes as real
// processes joined to the etcd cluster, which a test kills (SIGKILL),
// freezes (SIGSTOP) and starts again.
type clusterHarness struct {
	t        *testing.T
	etcd     []*childProcess // the members
	specs    []string        // each member's etcdMemberSpec, to start it again
	etcdURLs string
	src, dst *pgtest.Server
	srcConn  *pgx.Conn
	dstConn  *pgx.Conn
	ttl      time.Duration
	mu       sync.Mutex
	nodes    map[string]*nodeProc
	// committed are the load's rows, each with the WAL position after its
	// commit, in order.
	committed []committedRow
	// routed, set, makes startChangefeed's specification name the
	// databases by libpq service (service=source, service=target): each
	// node reaches them through its own proxies (nodeProc.src, dst).
	routed bool
	// slowDDL: the target's event trigger that slows an ALTER of t is
	// installed (freezeInsideATargetTransaction).
	slowDDL bool
	// columns counts the columns freezeInsideATargetTransaction added.
	columns int
}

// committedRow is a row of the load and the WAL position after its commit.
type committedRow struct {
	id    int
	after uint64
}

func parseLSN(t *testing.T, s string) uint64 {
	var hi, lo uint64
	_, err := fmt.Sscanf(s, "%X/%X", &hi, &lo)
	require.NoError(t, err, s)
	return hi<<32 | lo
}

// checkSlot samples slot's confirmed position every 200ms until stop is
// called, and checks that the target holds every row of the load whose
// commit is at or before it: a slot confirmed ahead of what the target
// holds durably would lose those rows at a crash. stop returns the
// samples taken, the rows checked over them (each sample checks every row
// behind its position), and the rows missing behind a confirmed
// position (0).
func (h *clusterHarness) checkSlot(slot string) (stop func() (samples, checked, missing int)) {
	ctx, cancel := context.WithCancel(context.Background())
	src, err := pgx.Connect(ctx, h.src.DSN)
	require.NoError(h.t, err)
	dst, err := pgx.Connect(ctx, h.dst.DSN)
	require.NoError(h.t, err)
	done := make(chan [3]int)
	go func() {
		defer src.Close(context.Background())
		defer dst.Close(context.Background())
		tick := time.NewTicker(200 * time.Millisecond) // a sampling rate, not ordering
		defer tick.Stop()
		var samples, checked, missing int
		for ctx.Err() == nil {
			var confirmed *string
			if err := src.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&confirmed); err == nil && confirmed != nil {
				c := parseLSN(h.t, *confirmed)
				h.mu.Lock()
				var ids []int32
				for _, r := range h.committed {
					if r.after <= c {
						ids = append(ids, int32(r.id))
					}
				}
				h.mu.Unlock()
				var n int
				// Read after the sample: the target can only hold more.
				if err := dst.QueryRow(ctx, "SELECT count(*) FROM unnest($1::int[]) s(id) WHERE NOT EXISTS (SELECT 1 FROM t WHERE t.id = s.id)", ids).
					Scan(&n); err == nil {
					samples++
					checked += len(ids)
					missing += n
				}
			}
			select {
			case <-ctx.Done():
			case <-tick.C:
			}
		}
		done <- [3]int{samples, checked, missing}
	}()
	return func() (int, int, int) { cancel(); r := <-done; return r[0], r[1], r[2] }
}

// nodeProc is one node process.
type nodeProc struct {
	id, addr, dir string
	child         *childProcess
	// etcd are the node's proxies to the etcd members (its --etcd): a
	// test partitions the node from etcd through them.
	etcd []*faultproxy.Proxy
	// src and dst are the node's proxies to the source and the target,
	// which its service file (PGSERVICEFILE) names as the services source
	// and target.
	src, dst *faultproxy.Proxy
	services string
}

// envEtcdMember, set, makes a test that builds a clusterHarness an etcd
// member instead (the harness runs each member as a child process of the
// test binary, running the same test: a member can be killed, and its
// server's goroutines are not the test process's).
const envEtcdMember = "CDCFLOW_TEST_ETCD_MEMBER"

// etcdMemberSpec is what a member child starts.
type etcdMemberSpec struct {
	Member  cluster.EmbeddedMember   `json:"member"`
	Cluster []cluster.EmbeddedMember `json:"cluster"`
	Token   string                   `json:"token"`
}

// runEtcdMember is the member child: it starts the member, says so on
// stdout, and serves until its stdin closes (its parent ended) or it is
// killed.
func runEtcdMember(spec string) {
	var m etcdMemberSpec
	if err := json.Unmarshal([]byte(spec), &m); err != nil {
		fmt.Fprintln(os.Stderr, "etcd member:", err)
		os.Exit(2)
	}
	e, err := cluster.StartEmbedded(context.Background(), cluster.EmbeddedOptions{Member: m.Member, Cluster: m.Cluster, Token: m.Token,
		ReadyTimeout: 2 * time.Minute})
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcd member:", err)
		os.Exit(2)
	}
	fmt.Println("etcd member ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	e.Close()
	os.Exit(0)
}

// newClusterHarness starts three etcd members (child processes) and the
// databases; the target keeps each transaction's commit time (the
// single-writer checker orders commits by it).
func newClusterHarness(t *testing.T, ttl time.Duration) *clusterHarness {
	if spec := os.Getenv(envEtcdMember); spec != "" {
		runEtcdMember(spec)
	}
	h := &clusterHarness{t: t, ttl: ttl, nodes: map[string]*nodeProc{}}
	var ms []cluster.EmbeddedMember
	for i := range 3 {
		ms = append(ms, cluster.EmbeddedMember{Name: fmt.Sprintf("e%d", i), Dir: t.TempDir(), ClientURL: "http://" + freeTCPAddr(t),
			PeerURL: "http://" + freeTCPAddr(t)})
	}
	var urls []string
	for _, m := range ms {
		spec, err := json.Marshal(etcdMemberSpec{Member: m, Cluster: ms, Token: t.Name()})
		require.NoError(t, err)
		h.specs = append(h.specs, string(spec))
		h.etcd = append(h.etcd, nil)
		h.startMember(len(h.etcd) - 1)
		urls = append(urls, m.ClientURL)
	}
	h.etcdURLs = strings.Join(urls, ",")
	c, err := clientv3.New(clientv3.Config{Endpoints: urls, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	defer c.Close()
	testwait.Within(t, 2*time.Minute, "the etcd cluster serving", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := c.Get(ctx, "health")
		return err == nil
	})
	h.src = pgtest.StartWith(t, pgtest.Options{Logical: true})
	h.dst = pgtest.StartWith(t, pgtest.Options{Settings: []string{"track_commit_timestamp=on"}})
	ctx := context.Background()
	h.srcConn, err = pgx.Connect(ctx, h.src.DSN)
	require.NoError(t, err)
	t.Cleanup(func() { h.srcConn.Close(context.Background()) })
	h.dstConn, err = pgx.Connect(ctx, h.dst.DSN)
	require.NoError(t, err)
	t.Cleanup(func() { h.dstConn.Close(context.Background()) })
	return h
}

// startMember starts etcd member i (again: on its data, a member that
// was lost coming back).
func (h *clusterHarness) startMember(i int) {
	h.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^"+h.t.Name()+"$", "-test.v=false")
	cmd.Env = append(os.Environ(), envEtcdMember+"="+h.specs[i])
	stdin, err := cmd.StdinPipe() // closed when the test ends: the member ends too
	require.NoError(h.t, err)
	h.etcd[i] = startChild(h.t, cmd, linewatch.New(`^etcd member`))
	h.t.Cleanup(func() { _ = stdin.Close() })
}

// killMember ends etcd member i with SIGKILL.
func (h *clusterHarness) killMember(i int) {
	h.t.Helper()
	select {
	case <-h.etcd[i].exited: // it should not have: say why it did
		out := h.etcd[i].stderr.String()
		h.t.Fatalf("etcd member %d exited by itself (%v): %s", i, h.etcd[i].err, out[max(0, len(out)-4000):])
	default:
	}
	require.NoError(h.t, h.etcd[i].cmd.Process.Signal(syscall.SIGKILL))
	_ = h.etcd[i].wait()
}

func freeTCPAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

// startNode starts node id as a process (again: with its data directory
// and address, as a new member).
func (h *clusterHarness) startNode(id string) *nodeProc {
	h.t.Helper()
	h.mu.Lock()
	p, ok := h.nodes[id]
	if !ok {
		p = &nodeProc{id: id, addr: freeTCPAddr(h.t), dir: h.t.TempDir()}
		for _, u := range strings.Split(h.etcdURLs, ",") {
			p.etcd = append(p.etcd, faultproxy.Start(h.t, strings.TrimPrefix(u, "http://")))
		}
		p.src, p.dst = faultproxy.Start(h.t, h.src.Addr), faultproxy.Start(h.t, h.dst.Addr)
		p.services = h.serviceFile(p)
		h.nodes[id] = p
	}
	h.mu.Unlock()
	var etcd []string
	for _, px := range p.etcd {
		etcd = append(etcd, "http://"+px.Addr)
	}
	cmd := exec.Command(buildCDCServer(h.t), "server", "--node-id", id, "--addr", p.addr, "--data-dir", p.dir, "--etcd", strings.Join(etcd, ","),
		"--lease-ttl", h.ttl.String(), "--balance-interval", "1h", "--log-level", "warn")
	cmd.Env = append(os.Environ(), "PGSERVICEFILE="+p.services)
	p.child = startChild(h.t, cmd, linewatch.New(`^server: node`))
	testwait.Within(h.t, time.Minute, id+" ready", func() bool {
		resp, err := http.Get("http://" + p.addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return p
}

// serviceFile writes node p's libpq service file: the services source
// and target are the databases through p's own proxies.
func (h *clusterHarness) serviceFile(p *nodeProc) string {
	h.t.Helper()
	var b strings.Builder
	for _, s := range []struct {
		name string
		db   *pgtest.Server
		via  *faultproxy.Proxy
	}{{"source", h.src, p.src}, {"target", h.dst, p.dst}} {
		cfg, err := pgconn.ParseConfig(s.db.DSN)
		require.NoError(h.t, err)
		host, port, err := net.SplitHostPort(s.via.Addr)
		require.NoError(h.t, err)
		fmt.Fprintf(&b, "[%s]\nhost=%s\nport=%s\nuser=%s\ndbname=%s\nsslmode=disable\n", s.name, host, port, cfg.User, cfg.Database)
	}
	path := filepath.Join(h.t.TempDir(), "pg_service.conf")
	require.NoError(h.t, os.WriteFile(path, []byte(b.String()), 0o600))
	return path
}

// kill ends node id with SIGKILL and waits for its exit.
func (h *clusterHarness) kill(id string) {
	h.t.Helper()
	p := h.nodes[id]
	require.NoError(h.t, p.child.cmd.Process.Signal(syscall.SIGKILL))
	_ = p.child.wait()
}

// apiClient gives up on a node that does not answer (one frozen).
var apiClient = &http.Client{Timeout: 5 * time.Second}

// signal sends sig to node id.
func (h *clusterHarness) signal(id string, sig syscall.Signal) {
	h.t.Helper()
	require.NoError(h.t, h.nodes[id].child.cmd.Process.Signal(sig))
}

// coordinator is the node the cluster says coordinates ("" none).
func (h *clusterHarness) coordinator() string {
	var nodes []cluster.NodeView
	if h.api("GET", "/api/v1/nodes", nil, &nodes) != http.StatusOK {
		return ""
	}
	for _, n := range nodes {
		if n.Coordinator {
			return n.ID
		}
	}
	return ""
}

// lastWriter is the writer of the audit's last row after seq from ("" none).
func (h *clusterHarness) lastWriter(from int64) string {
	var w string
	if h.dstConn.QueryRow(context.Background(), "SELECT writer FROM audit.log WHERE seq > $1 ORDER BY seq DESC LIMIT 1", from).Scan(&w) != nil {
		return ""
	}
	return w
}

// api calls a live node's API (the first that answers) and decodes a
// reply of 2xx into out; it returns the status.
func (h *clusterHarness) api(method, path string, body, out any) int {
	h.t.Helper()
	h.mu.Lock()
	var addrs []string
	for _, p := range h.nodes {
		select {
		case <-p.child.exited:
		default:
			addrs = append(addrs, p.addr)
		}
	}
	h.mu.Unlock()
	for _, addr := range addrs {
		var r io.Reader
		if body != nil {
			b, err := json.Marshal(body)
			require.NoError(h.t, err)
			r = bytes.NewReader(b)
		}
		req, err := http.NewRequest(method, "http://"+addr+path, r)
		require.NoError(h.t, err)
		resp, err := apiClient.Do(req)
		if err != nil {
			continue // a node frozen or dying: another answers
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(h.t, err)
		if out != nil && resp.StatusCode < 300 {
			require.NoError(h.t, json.Unmarshal(b, out), string(b))
		}
		return resp.StatusCode
	}
	h.t.Fatalf("no node answers")
	return 0
}

// owner is the node changefeed name is assigned to ("" none).
func (h *clusterHarness) owner(name string) string {
	var v cluster.ChangefeedView
	if h.api("GET", "/api/v1/changefeeds/"+name+"?status=false", nil, &v) != http.StatusOK || v.Assignment == nil {
		return ""
	}
	return v.Assignment.Node
}

// auditTarget creates the target's table t before the changefeed does,
// with a trigger that logs every write with the sink that made it
// (cdcflow.writer, which the fence sets) and its transaction.
func (h *clusterHarness) auditTarget() {
	h.t.Helper()
	for _, q := range []string{
		"CREATE SCHEMA audit",
		"CREATE TABLE audit.log (seq bigserial PRIMARY KEY, writer text, xact xid, op text, id int)",
		"CREATE TABLE public.t (id int PRIMARY KEY, v text)",
		`CREATE FUNCTION audit.f() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
  INSERT INTO audit.log (writer, xact, op, id) VALUES (current_setting('cdcflow.writer', true), xid(pg_current_xact_id()), TG_OP,
    CASE WHEN TG_OP = 'DELETE' THEN OLD.id ELSE NEW.id END);
  RETURN NULL;
END $$`,
		"CREATE TRIGGER audit AFTER INSERT OR UPDATE OR DELETE ON public.t FOR EACH ROW EXECUTE FUNCTION audit.f()",
	} {
		_, err := h.dstConn.Exec(context.Background(), q)
		require.NoError(h.t, err, q)
	}
}

// auditVerdict is what the audit of t's writes after seq from shows.
type auditVerdict struct {
	// Lost are the source's rows missing from the target; Twice the rows
	// written more than once (an insert applied again is an upsert: an
	// UPDATE of a row inserted once at the source).
	Lost, Twice int
	// Writers are the sinks that wrote, in the order of their first
	// commit; Overlaps the commits of a writer after the first commit of
	// a later one (the single-writer property: 0).
	Writers  []string
	Overlaps int
}

// audit checks t's writes logged after seq from against the source's rows
// with id > minID.
func (h *clusterHarness) audit(from int64, minID int) auditVerdict {
	h.t.Helper()
	ctx := context.Background()
	var v auditVerdict
	rows, err := h.srcConn.Query(ctx, "SELECT id FROM t WHERE id > $1", minID)
	require.NoError(h.t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	require.NoError(h.t, err)
	require.NoError(h.t, h.dstConn.QueryRow(ctx, `SELECT count(*) FROM unnest($1::int[]) s(id) WHERE NOT EXISTS (SELECT 1 FROM t WHERE t.id = s.id)`, ids).
		Scan(&v.Lost))
	require.NoError(h.t, h.dstConn.QueryRow(ctx, `SELECT count(*) FROM (SELECT id FROM audit.log WHERE seq > $1 AND id > $2 GROUP BY id
HAVING count(*) > 1 OR bool_or(op <> 'INSERT')) x`, from, minID).Scan(&v.Twice))
	// Generations in the order of their first commit, and commits of an
	// older one after a newer one's first.
	rows, err = h.dstConn.Query(ctx, `
WITH c AS (SELECT DISTINCT writer, xact, pg_xact_commit_timestamp(xact) AS at FROM audit.log WHERE seq > $1),
     w AS (SELECT writer, split_part(writer, '/', 2)::bigint AS gen, min(at) AS first FROM c GROUP BY writer)
SELECT writer, (SELECT count(*) FROM c JOIN w newer ON newer.gen > w.gen WHERE c.writer = w.writer AND c.at > newer.first)
FROM w ORDER BY first`, from)
	require.NoError(h.t, err)
	for rows.Next() {
		var writer string
		var overlaps int
		require.NoError(h.t, rows.Scan(&writer, &overlaps))
		v.Writers = append(v.Writers, writer)
		v.Overlaps += overlaps
	}
	require.NoError(h.t, rows.Err())
	return v
}

// startChangefeed makes table t on the source with rows ids 1..rows (its
// target audited), starts nodes n1, n2, n3, creates changefeed cf and
// waits until its snapshot is applied; it returns the audit's mark from
// there.
func (h *clusterHarness) startChangefeed(rows int) int64 {
	h.t.Helper()
	_, err := h.srcConn.Exec(h.t.Context(), "CREATE TABLE t (id int PRIMARY KEY, v text)")
	require.NoError(h.t, err)
	_, err = h.srcConn.Exec(h.t.Context(), "INSERT INTO t SELECT g, 'snapshot' FROM generate_series(1, $1::int) g", rows)
	require.NoError(h.t, err)
	h.auditTarget()
	for _, id := range []string{"n1", "n2", "n3"} {
		h.startNode(id)
	}
	config := node.ChangefeedConfig{Source: h.src.DSN, Sink: h.dst.DSN}
	if h.routed {
		config = node.ChangefeedConfig{Source: "service=source", Sink: "service=target"}
	}
	require.Equal(h.t, http.StatusCreated, h.api("POST", "/api/v1/changefeeds", map[string]any{"name": "cf", "config": config}, nil))
	h.equal("the snapshot")
	h.snapshotApplied()
	return h.auditMark()
}

// snapshotApplied waits until the changefeed's snapshot is recorded as
// applied: a node that takes it over before starts over, copying every
// table again (by design: a snapshot cannot be resumed), which the audit
// would count as rows written twice.
func (h *clusterHarness) snapshotApplied() {
	h.t.Helper()
	testwait.Within(h.t, time.Minute, "the snapshot recorded as applied", func() bool {
		var q struct {
			Status struct {
				Snapshot string `json:"snapshot"`
			} `json:"status"`
		}
		return h.api("GET", "/api/v1/changefeeds/cf", nil, &q) == http.StatusOK && q.Status.Snapshot == "applied"
	})
}

// writing waits for rows written by the changefeed's owner and returns
// its writer.
func (h *clusterHarness) writing(what string) string {
	h.t.Helper()
	from := h.auditMark()
	var w string
	testwait.Within(h.t, time.Minute, what, func() bool { w = h.lastWriter(from); return w != "" })
	return w
}

// quiesced stops the load (stop), waits until the target equals the
// source, and requires the audit of every write after mark to show no row
// lost or written twice and no commit of an older writer after a newer
// one's first; it returns the verdict.
func (h *clusterHarness) quiesced(stop func() int, mark int64, minID int) auditVerdict {
	h.t.Helper()
	last := stop()
	h.equal("after the faults")
	v := h.audit(mark, minID)
	h.t.Logf("audit: %d rows loaded, lost %d, written twice %d, writers %s, overlaps %d", last-minID, v.Lost, v.Twice,
		strings.Join(v.Writers, " "), v.Overlaps)
	require.Zero(h.t, v.Lost, "rows lost")
	require.Zero(h.t, v.Twice, "rows written twice")
	require.Zero(h.t, v.Overlaps, "commits of an older writer after a newer one's first")
	return v
}

// auditMark is the audit's last seq: what follows it is a test's.
func (h *clusterHarness) auditMark() int64 {
	var seq int64
	require.NoError(h.t, h.dstConn.QueryRow(context.Background(), "SELECT coalesce(max(seq), 0) FROM audit.log").Scan(&seq))
	return seq
}

// writerAfter waits until a writer other than those in old commits to t,
// and returns it and when the test saw it.
func (h *clusterHarness) writerAfter(from int64, old string, within time.Duration) (string, time.Time) {
	h.t.Helper()
	var w string
	testwait.Within(h.t, within, "a new writer's first commit", func() bool {
		err := h.dstConn.QueryRow(context.Background(), "SELECT writer FROM audit.log WHERE seq > $1 AND writer <> $2 ORDER BY seq LIMIT 1", from, old).
			Scan(&w)
		return err == nil
	})
	return w, time.Now()
}

// load inserts one row a transaction into the source's t, from id on,
// at most one every 2ms, until stop is called; stop returns the last id
// inserted.
func (h *clusterHarness) load(id int) (stop func() int) {
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgx.Connect(ctx, h.src.DSN)
	require.NoError(h.t, err)
	done := make(chan int)
	go func() {
		defer conn.Close(context.Background())
		pace := time.NewTicker(2 * time.Millisecond) // a steady load, not the most the source takes
		defer pace.Stop()
		for ctx.Err() == nil {
			if _, err := conn.Exec(ctx, "INSERT INTO t VALUES ($1, 'load')", id+1); err != nil {
				break
			}
			id++
			// The WAL position after its commit, at or past the commit's
			// own (the slot checker's).
			var lsn string
			if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
				break
			}
			h.mu.Lock()
			h.committed = append(h.committed, committedRow{id: id, after: parseLSN(h.t, lsn)})
			h.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-pace.C:
			}
		}
		done <- id
	}()
	return func() int { cancel(); return <-done }
}

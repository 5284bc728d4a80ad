package node

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/pingcap/log"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/cdcflow/eventservice/cmd/cdcserver/app/replicate"
	"github.com/cdcflow/eventservice/pkg/cluster"
)

// ErrSetup is a node that could not start (etcd unreachable, its ID taken,
// its address in use).
var ErrSetup = errors.New("node: setup")

// node is a running node's parts.
type node struct {
	cfg    Config
	id     string
	log    *zap.Logger
	stderr io.Writer
	client *clientv3.Client
	keys   cluster.Keys
	store  *cluster.Store
	member *cluster.Member
	reg    *prometheus.Registry
	runs   *runners
	ready  chan struct{} // closed once the node's loops run
	// coordMetrics are registered once; each campaign's Coordinator
	// shares them.
	coordMetrics *cluster.CoordinatorMetrics
	// cache is the block cache every changefeed's event store shares
	// (--store-cache-size): each run's store holds a reference while it
	// is open, the node its own until Run ends.
	cache *pebble.Cache
}

// Run is `cdcserver server`: it joins the cluster (starting an embedded
// etcd without --etcd), campaigns to coordinate, runs the changefeeds
// assigned to it, and serves the API until ctx ends (SIGTERM), then hands
// its changefeeds off (drains) within DrainTimeout and leaves. A lost
// membership stops every changefeed it runs and ends Run with
// cluster.ErrLeaseLost: a supervisor starts it again, as a new member.
func Run(ctx context.Context, cfg Config, stderr io.Writer) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	lg, _, err := log.InitLoggerWithWriteSyncer(&log.Config{Level: cfg.LogLevel, Format: cfg.LogFormat, DisableStacktrace: cfg.LogLevel != "debug"},
		zapcore.AddSync(stderr), zapcore.AddSync(stderr))
	if err != nil {
		return fmt.Errorf("%w: logger: %w", ErrInvalidConfig, err)
	}
	n := &node{cfg: cfg, id: cfg.nodeID(), log: lg.With(zap.String("node", cfg.nodeID())), stderr: stderr,
		keys: cluster.NewKeys(cfg.Cluster), reg: prometheus.NewRegistry(), ready: make(chan struct{})}
	defer cfg.Settings.Apply(os.Getenv)()
	n.cache = pebble.NewCache(cfg.StoreCacheSize)
	defer n.cache.Unref() // after the runs stopped (run) and the HTTP server (its deferred shutdown runs first)
	n.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "cdcflow", Subsystem: "cluster", Name: "store_cache_bytes",
			Help: "Bytes of blocks in the block cache the changefeeds' event stores share (at most --store-cache-size less what their memtables reserve in it)"},
			func() float64 { return float64(n.cache.Size()) }))
	token := ""
	if cfg.APITokenFile != "" {
		if token, err = readToken(cfg.APITokenFile); err != nil {
			return fmt.Errorf("%w: --api-token-file: %w", ErrSetup, err)
		}
	}
	tlsCfg, err := serverTLS(cfg)
	if err != nil {
		return fmt.Errorf("%w: the API's TLS: %w", ErrSetup, err)
	}
	lis, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSetup, err)
	}
	defer lis.Close()
	scheme := "http"
	served := limitPerIP(lis, maxConnsPerIP)
	if tlsCfg != nil {
		served, scheme = tls.NewListener(served, tlsCfg), "https"
	}
	if cfg.PprofAddr != "" {
		plis, err := net.Listen("tcp", cfg.PprofAddr)
		if err != nil {
			return fmt.Errorf("%w: --pprof-addr: %w", ErrSetup, err)
		}
		prof := &http.Server{Handler: replicate.PprofMux(), ReadHeaderTimeout: 5 * time.Second}
		var pwg sync.WaitGroup
		pwg.Go(func() { _ = prof.Serve(plis) })
		defer func() { _ = prof.Close(); pwg.Wait() }()
		fmt.Fprintf(stderr, "server: pprof at http://%s/debug/pprof/\n", plis.Addr())
	}
	stopEtcd, err := n.connectEtcd(ctx)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSetup, err)
	}
	defer stopEtcd()
	n.store = cluster.NewStore(n.client, n.keys)
	info, _ := json.Marshal(cluster.NodeInfo{Addr: lis.Addr().String(), Started: time.Now().UTC()}) // plain types
	if n.coordMetrics, err = cluster.NewCoordinatorMetrics(n.reg); err != nil {
		return fmt.Errorf("%w: %w", ErrSetup, err)
	}
	if n.member, err = n.join(ctx, info); err != nil {
		return fmt.Errorf("%w: %w", ErrSetup, err)
	}
	defer n.member.Close()
	if n.runs, err = newRunners(n); err != nil {
		return fmt.Errorf("%w: %w", ErrSetup, err)
	}
	srv := &http.Server{Handler: requireToken(token, n.api()), ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		IdleTimeout: time.Minute, MaxHeaderBytes: 64 << 10}
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(served) })
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = srv.Shutdown(sctx)
		cancel()
		wg.Wait()
	}()
	fmt.Fprintf(stderr, "server: node %s of cluster %s; API at %s://%s\n", n.id, cfg.Cluster, scheme, lis.Addr())
	return n.run(ctx)
}

// join starts the node's membership. A node started again under its ID
// soon after it ended (a crash, a supervisor's restart) finds its old
// key still held by the old lease until that expires: it waits for it,
// up to two TTLs, rather than fail.
func (n *node) join(ctx context.Context, info []byte) (*cluster.Member, error) {
	deadline := time.Now().Add(2 * n.cfg.LeaseTTL)
	for {
		m, err := cluster.StartMember(ctx, cluster.MemberOptions{Client: n.client, Keys: n.keys, NodeID: n.id, Info: info,
			TTL: n.cfg.LeaseTTL, Logger: n.log, Registerer: n.reg})
		if !errors.Is(err, cluster.ErrNodeExists) || time.Now().After(deadline) {
			return m, err
		}
		n.log.Info("the node's ID is still held by its previous lease: waiting for it to expire")
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// run runs the coordinator's candidacy and the changefeeds until ctx ends
// (then drains: the coordinator's loop keeps running, so that a node that
// coordinates moves its own changefeeds off too) or the membership is
// lost.
func (n *node) run(ctx context.Context) error {
	loops, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	wg.Go(func() { n.coordinate(loops) })
	wg.Go(func() { n.runs.reconcileLoop(loops) })
	close(n.ready)
	var err error
	select {
	case <-ctx.Done():
		n.drain()
	case <-n.member.Lost():
		err = n.member.Err()
	}
	cancel()
	ended := make(chan struct{})
	go func() { wg.Wait(); close(ended) }()
	select {
	case <-ended:
	case <-time.After(loopsStopWait):
		// etcd without a quorum: a campaign that ends resigns with the
		// client's own context, which only the client's close ends
		// (docs/design/cluster.md).
		n.log.Warn("the node's etcd calls do not end: closing its etcd client")
		_ = n.client.Close()
		<-ended
	}
	n.runs.stopAll()
	return err
}

// loopsStopWait bounds the wait for the node's loops to end before its
// etcd client is closed under them.
const loopsStopWait = 5 * time.Second

// coordinate campaigns, and campaigns again when a leadership ends for
// another reason than the node's own end.
func (n *node) coordinate(ctx context.Context) {
	for ctx.Err() == nil && n.member.Valid() {
		co, err := cluster.NewCoordinator(cluster.CoordinatorOptions{Member: n.member, BalanceInterval: n.cfg.BalanceInterval, Logger: n.log,
			Metrics: n.coordMetrics})
		if err != nil {
			n.log.Error("coordinator", zap.Error(err))
			return
		}
		if err := co.Run(ctx); err != nil && ctx.Err() == nil {
			n.log.Warn("the coordinator's loop ended: campaigning again", zap.Error(err))
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

// drain marks the node draining, so that the coordinator moves its
// changefeeds off, and waits until none is assigned to it (or
// DrainTimeout).
func (n *node) drain() {
	ctx, cancel := context.WithTimeout(context.Background(), n.cfg.DrainTimeout)
	defer cancel()
	if err := n.store.Drain(ctx, n.id); err != nil {
		n.log.Warn("drain: marking the node draining failed; leaving without a hand-off", zap.Error(err))
		return
	}
	n.log.Info("draining: handing the node's changefeeds off")
	for {
		nodes, err := n.store.Nodes(ctx)
		if err == nil {
			mine := 0
			for _, v := range nodes {
				if v.ID == n.id {
					mine = len(v.Changefeeds)
				}
			}
			if mine == 0 {
				n.log.Info("drained")
				return
			}
		}
		select {
		case <-ctx.Done():
			n.log.Warn("drain: the node's changefeeds were not all handed off within --drain-timeout; leaving", zap.Duration("timeout", n.cfg.DrainTimeout))
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// connectEtcd connects to --etcd, or starts the embedded member first.
func (n *node) connectEtcd(ctx context.Context) (func(), error) {
	cfg := n.cfg
	endpoints := strings.Split(cfg.Etcd, ",")
	stop := func() {}
	if cfg.Etcd == "" {
		m := cluster.EmbeddedMember{Name: n.id, Dir: filepath.Join(cfg.DataDir, "etcd"), ClientURL: "http://" + cfg.EtcdClientAddr,
			PeerURL: "http://" + cfg.EtcdPeerAddr}
		if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
			return nil, err
		}
		e, err := cluster.StartEmbedded(ctx, cluster.EmbeddedOptions{Member: m, Token: "cdcflow-" + cfg.Cluster})
		if err != nil {
			return nil, err
		}
		stop = e.Close
		endpoints = []string{m.ClientURL}
	}
	var tlsCfg *tls.Config
	if cfg.EtcdCA != "" {
		info := transport.TLSInfo{TrustedCAFile: cfg.EtcdCA, CertFile: cfg.EtcdCert, KeyFile: cfg.EtcdKey}
		var err error
		if tlsCfg, err = info.ClientConfig(); err != nil {
			stop()
			return nil, err
		}
	}
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 10 * time.Second, TLS: tlsCfg, Logger: zap.NewNop()})
	if err != nil {
		stop()
		return nil, err
	}
	n.client = c
	return func() { _ = c.Close(); stop() }, nil
}

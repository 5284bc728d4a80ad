package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/cmd/cdcserver/app/replicate"
	"github.com/cdcflow/eventservice/internal/backoff"
	"github.com/cdcflow/eventservice/pkg/cluster"
)

// runners are the changefeeds this node runs: one replicate.RunEmbedded
// each, started when an assignment names this node and the changefeed is
// to run, stopped (a clean stop) when either ends. Each is isolated: its
// own event store, registry and goroutines; one that fails is started
// again after a back-off and never stops another.
type runners struct {
	n  *node
	mu sync.Mutex
	// running by changefeed name.
	running map[string]*runner
	wg      sync.WaitGroup
	// restarts counts each changefeed's runs that ended by themselves
	// and were started again (runningCollector reports what runs).
	restarts *prometheus.CounterVec
}

// runner is one changefeed running here.
type runner struct {
	name   string
	config []byte // the specification's configuration it runs with
	// metrics is the current run's registry (each run registers anew).
	metrics atomic.Pointer[prometheus.Registry]
	cancel  context.CancelFunc
	done    chan struct{}
	mu      sync.Mutex
	last    error // the last run's end (nil: running, or a clean stop)
}

func newRunners(n *node) (*runners, error) {
	rs := &runners{n: n, running: map[string]*runner{},
		restarts: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "cdcflow", Subsystem: "cluster", Name: "changefeed_restarts_total",
			Help: "Runs of the changefeed on this node that ended by themselves and were started again after a back-off"}, []string{"changefeed"})}
	for _, c := range []prometheus.Collector{runningCollector{rs}, rs.restarts} {
		if err := n.reg.Register(c); err != nil {
			return nil, err
		}
	}
	return rs, nil
}

// reconcileLoop reconciles at every change of the changefeeds' keys, and
// every second (a failed start is retried by its runner, a missed watch
// event by the tick).
func (rs *runners) reconcileLoop(ctx context.Context) {
	watch := rs.n.client.Watch(clientv3.WithRequireLeader(ctx), rs.n.keys.Changefeeds(), clientv3.WithPrefix())
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		rs.reconcile(ctx)
		select {
		case <-ctx.Done():
			return
		case resp, ok := <-watch:
			if !ok || resp.Err() != nil {
				watch = rs.n.client.Watch(clientv3.WithRequireLeader(ctx), rs.n.keys.Changefeeds(), clientv3.WithPrefix())
			}
		case <-tick.C:
		}
	}
}

// reconcile starts the changefeeds assigned here that do not run, and
// stops those that run and are not (or run an older configuration).
func (rs *runners) reconcile(ctx context.Context) {
	if !rs.n.member.Valid() {
		rs.stopAll()
		return
	}
	list, err := rs.n.store.List(ctx)
	if err != nil {
		return // etcd unreachable: the membership's deadline decides
	}
	want := map[string][]byte{}
	for _, v := range list {
		if v.Spec.State == cluster.StateRunning && v.Assignment != nil && v.Assignment.Node == rs.n.id {
			want[v.Name] = v.Spec.Config
		}
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for name, r := range rs.running {
		if c, ok := want[name]; !ok || !bytes.Equal(c, r.config) {
			rs.stopLocked(r)
		}
	}
	for name, c := range want {
		if _, ok := rs.running[name]; !ok {
			rs.startLocked(name, c)
		}
	}
}

// startLocked starts changefeed name with its configuration c.
func (rs *runners) startLocked(name string, c []byte) {
	ctx, cancel := context.WithCancel(context.Background())
	r := &runner{name: name, config: c, cancel: cancel, done: make(chan struct{})}
	rs.running[name] = r
	rs.restarts.WithLabelValues(name) // exported from 0, so that an increase shows
	log := rs.n.log.With(zap.String("changefeed", name))
	log.Info("running the changefeed here")
	rs.wg.Go(func() {
		defer close(r.done)
		pause := backoff.Backoff{Base: time.Second, Max: time.Minute, Jitter: 0.2}
		for ctx.Err() == nil {
			err := rs.runOnce(ctx, r)
			r.mu.Lock()
			r.last = err
			r.mu.Unlock()
			if ctx.Err() != nil {
				return
			}
			wait := pause.Next()
			rs.restarts.WithLabelValues(name).Inc()
			log.Error("the changefeed stopped: starting it again", zap.Error(err), zap.Duration("in", wait))
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
	})
}

// runOnce runs r's changefeed until ctx ends or the run stops.
func (rs *runners) runOnce(ctx context.Context, r *runner) error {
	var c ChangefeedConfig
	name := r.name
	if err := json.Unmarshal(r.config, &c); err != nil {
		return fmt.Errorf("%w: %w", ErrBadSpec, err)
	}
	cfg, err := serveConfig(name, c, rs.n.cfg.DataDir, rs.n.cfg.LogLevel)
	if err != nil {
		return err
	}
	cfg.LogFormat = rs.n.cfg.LogFormat
	run := prometheus.NewRegistry()
	r.metrics.Store(nil) // the last run's are gone; this run's once it serves
	err = replicate.RunEmbedded(ctx, cfg, rs.n.stderr, rs.embedding(r, run))
	if err == nil && ctx.Err() == nil {
		err = errors.New("the changefeed's run ended by itself")
	}
	return err
}

// embedding is what a run of r's changefeed gets from the node: run, its
// registry; the membership's permit; the node's shared block cache and
// memtable size for its event store; the node's --sink-queue-size for its
// sink.
func (rs *runners) embedding(r *runner, run *prometheus.Registry) replicate.Embedding {
	permit := func() error {
		if !rs.n.member.Valid() {
			return fmt.Errorf("%w: node %s", cluster.ErrLeaseLost, rs.n.id)
		}
		return nil
	}
	// A previous owner frozen inside a target transaction holds the
	// take-over half a TTL at most: what it holds when this run starts it
	// began before its deadline, at least TTL/5 before its lease expired;
	// half a TTL more lets a slow commit finish, and what is still held
	// then is stuck, so its backend is ended (its transaction rolls back,
	// and this run applies those rows again).
	return replicate.Embedding{Registry: run, Permit: permit, FenceWait: rs.n.cfg.LeaseTTL / 2, Serving: func() { r.metrics.Store(run) },
		StoreCache: rs.n.cache, StoreMemTableBytes: uint64(rs.n.cfg.StoreMemTableSize),
		SinkQueueBytes: rs.n.cfg.SinkQueueSize}
}

// stopLocked stops r (a clean stop) and forgets it; it ends by itself.
func (rs *runners) stopLocked(r *runner) {
	rs.n.log.Info("the changefeed no longer runs here", zap.String("changefeed", r.name))
	r.cancel()
	delete(rs.running, r.name)
}

// stopAll stops every changefeed and waits for them.
func (rs *runners) stopAll() {
	rs.mu.Lock()
	for _, r := range rs.running {
		rs.stopLocked(r)
	}
	rs.mu.Unlock()
	rs.wg.Wait()
}

// names are the changefeeds running here, with each one's last error.
func (rs *runners) status() map[string]string {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	out := map[string]string{}
	for name, r := range rs.running {
		r.mu.Lock()
		out[name] = ""
		if r.last != nil {
			out[name] = r.last.Error()
		}
		r.mu.Unlock()
	}
	return out
}

// runningDesc is cdcflow_cluster_changefeed_running.
var runningDesc = prometheus.NewDesc("cdcflow_cluster_changefeed_running",
	"1 for each changefeed this node runs (one whose sum over the nodes is above 1 runs twice)", []string{"changefeed"}, nil)

// runningCollector reports the changefeeds running here, read at scrape.
type runningCollector struct{ rs *runners }

func (runningCollector) Describe(ch chan<- *prometheus.Desc) { ch <- runningDesc }

func (c runningCollector) Collect(ch chan<- prometheus.Metric) {
	c.rs.mu.Lock()
	defer c.rs.mu.Unlock()
	for name := range c.rs.running {
		ch <- prometheus.MustNewConstMetric(runningDesc, prometheus.GaugeValue, 1, name)
	}
}

// gatherers are the running changefeeds' metrics, each labelled with its
// changefeed's name.
func (rs *runners) gatherers() prometheus.Gatherers {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	var out prometheus.Gatherers
	for name, r := range rs.running {
		if reg := r.metrics.Load(); reg != nil {
			out = append(out, labelled{name: name, g: reg})
		}
	}
	return out
}

// labelled gathers a changefeed's metrics with its name as a label.
type labelled struct {
	name string
	g    *prometheus.Registry
}

func (l labelled) Gather() ([]*dto.MetricFamily, error) {
	fams, err := l.g.Gather()
	label := "changefeed"
	for _, f := range fams {
		for _, m := range f.Metric {
			m.Label = append(m.Label, &dto.LabelPair{Name: &label, Value: &l.name})
		}
	}
	return fams, err
}

package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdcflow/eventservice/internal/optcheck"
	"github.com/cdcflow/eventservice/pkg/clock"
)

// The coordinator's loop: the shell around Place. A round reads the live
// nodes, the changefeeds' specifications and their assignments, calls
// Place, and writes each decision guarded twice: by the leadership
// (Leadership.Txn) and by the assignment's mod revision as read, so a
// round over a stale reading changes nothing (ErrConflict: the next round
// reads again). Rounds run when a node or changefeed key changes, and
// every BalanceInterval; only the timed rounds make moves to even the load.

// NodeInfo is a node key's value.
type NodeInfo struct {
	// Addr is the node's HTTP API address.
	Addr string `json:"addr"`
	// Draining: it hands its changefeeds off (node drain, SIGTERM).
	Draining bool      `json:"draining,omitempty"`
	Started  time.Time `json:"started"`
}

// Spec is a changefeed's specification key's value: what it replicates
// (the serve options, Config) and its desired state.
type Spec struct {
	// State is StateRunning or StatePaused.
	State  string          `json:"state"`
	Config json.RawMessage `json:"config"`
}

// Desired states of a changefeed.
const (
	StateRunning = "running"
	StatePaused  = "paused"
)

// Assignment is an assignment key's value: the node that runs the
// changefeed ("" for none), and the coordinator's fencing token when it
// was decided.
type Assignment struct {
	Node string `json:"node"`
	// By is the deciding coordinator's Leadership.Rev.
	By  int64     `json:"by"`
	At  time.Time `json:"at"`
	Why Reason    `json:"why"`
	// History is the changefeed's last moves, oldest first (at most
	// maxHistory).
	History []Move `json:"history,omitempty"`
}

// Move is one decision in a changefeed's history.
type Move struct {
	From string    `json:"from,omitempty"`
	To   string    `json:"to,omitempty"`
	At   time.Time `json:"at"`
	Why  Reason    `json:"why"`
}

// maxHistory bounds an assignment's history.
const maxHistory = 20

// CoordinatorOptions run the coordinator's loop.
type CoordinatorOptions struct {
	Member *Member
	// BalanceInterval is how often a round may move changefeeds only to
	// even the load (default 15s), MaxBalanceMoves how many it may move
	// (default 1).
	BalanceInterval time.Duration
	MaxBalanceMoves int
	Clock           clock.Clock
	Logger          *zap.Logger
	// Registerer, if set, receives the coordinator's metrics
	// (cdcflow_cluster_coordinator, _live_nodes, _changefeeds,
	// _unplaced_changefeeds, _assigned_changefeeds, _assignments_total).
	// A node registers them once and gives its Coordinators the same
	// Metrics instead (NewCoordinatorMetrics).
	Registerer prometheus.Registerer
	// Metrics, if set, are metrics registered before (a node campaigns
	// again with a new Coordinator).
	Metrics *CoordinatorMetrics
}

// EnsureDefaults returns a copy of o with every zero field set to its
// documented default.
func (o CoordinatorOptions) EnsureDefaults() CoordinatorOptions {
	if o.BalanceInterval == 0 {
		o.BalanceInterval = 15 * time.Second
	}
	if o.MaxBalanceMoves == 0 {
		o.MaxBalanceMoves = 1
	}
	o.Clock = clock.OrReal(o.Clock)
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return o
}

// Validate reports what is wrong with o (after EnsureDefaults).
func (o CoordinatorOptions) Validate() error {
	p := optcheck.New(ErrInvalidOptions)
	p.Required("CoordinatorOptions.Member", o.Member)
	p.Require(o.BalanceInterval > 0, "CoordinatorOptions.BalanceInterval %v is not positive", o.BalanceInterval)
	p.IntRange("CoordinatorOptions.MaxBalanceMoves", o.MaxBalanceMoves, 0, 1<<20)
	return p.Err()
}

// Coordinator is a node's candidacy for coordinator and, once elected, its
// placement loop.
type Coordinator struct {
	opts  CoordinatorOptions
	met   *coordinatorMetrics
	knobs testingKnobs
	wg    sync.WaitGroup
}

// NewCoordinator validates opts; Run campaigns and coordinates.
func NewCoordinator(opts CoordinatorOptions) (*Coordinator, error) {
	opts = opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	met := opts.Metrics
	if met == nil {
		var err error
		if met, err = NewCoordinatorMetrics(opts.Registerer); err != nil {
			return nil, err
		}
	}
	return &Coordinator{opts: opts, met: met.m}, nil
}

// CoordinatorMetrics are a node's coordinator metrics, registered once.
type CoordinatorMetrics struct{ m *coordinatorMetrics }

// NewCoordinatorMetrics registers the coordinator's metrics with reg (nil:
// none).
func NewCoordinatorMetrics(reg prometheus.Registerer) (*CoordinatorMetrics, error) {
	m, err := newCoordinatorMetrics(reg)
	if err != nil {
		return nil, err
	}
	return &CoordinatorMetrics{m: m}, nil
}

// Run campaigns until the node is the coordinator, then runs rounds until
// ctx ends (it resigns; nil) or the membership is lost (its writes would
// fail, another node's campaign wins: the membership's error).
func (co *Coordinator) Run(ctx context.Context) error {
	opts := co.opts
	m := opts.Member
	ctx, cancel := context.WithCancel(ctx)
	defer co.wg.Wait()
	defer cancel()
	co.wg.Go(func() { // the membership lost: stop campaigning or leading
		select {
		case <-m.Lost():
			cancel()
		case <-ctx.Done():
		}
	})
	l, err := Campaign(ctx, m)
	if err != nil {
		if ctx.Err() != nil {
			return m.Err()
		}
		return err
	}
	defer func() {
		rctx, rcancel := context.WithTimeout(context.Background(), m.ttl)
		_ = l.Resign(rctx)
		rcancel()
	}()
	opts.Logger.Info("this node is the coordinator", zap.String("node", m.opts.NodeID), zap.Int64("rev", l.Rev()))
	co.met.coordinator.Set(1)
	defer co.met.coordinator.Set(0)
	keys := m.opts.Keys
	watch := m.opts.Client.Watch(clientv3.WithRequireLeader(ctx), keys.root, clientv3.WithPrefix())
	tick := opts.Clock.NewTicker(opts.BalanceInterval)
	defer tick.Stop()
	balance := 0
	for {
		if err := co.round(ctx, l, balance); err != nil && !errors.Is(err, ErrConflict) {
			if ctx.Err() != nil {
				return m.Err() // stopped (nil), or the membership lost
			}
			if errors.Is(err, ErrNotCoordinator) {
				return errors.Join(err, m.Err())
			}
			opts.Logger.Warn("a placement round failed: the next one tries again", zap.Error(err))
		}
		balance = 0
		select {
		case <-ctx.Done():
			return m.Err()
		case resp, ok := <-watch:
			if !ok || resp.Err() != nil {
				watch = m.opts.Client.Watch(clientv3.WithRequireLeader(ctx), keys.root, clientv3.WithPrefix())
			}
		case <-tick.C():
			balance = opts.MaxBalanceMoves
		}
	}
}

// round reads the cluster, places, and writes the decisions.
func (co *Coordinator) round(ctx context.Context, l *Leadership, balance int) error {
	opts, m := co.opts, co.opts.Member
	keys := m.opts.Keys
	c := m.opts.Client
	nodes, err := c.Get(ctx, keys.Nodes(), clientv3.WithPrefix())
	if err != nil {
		return err
	}
	in := PlaceInput{MaxBalanceMoves: balance}
	for _, kv := range nodes.Kvs {
		var info NodeInfo
		if json.Unmarshal(kv.Value, &info) != nil {
			continue // not a node this version can read: given nothing
		}
		in.Nodes = append(in.Nodes, PlaceNode{ID: keys.NodeID(string(kv.Key)), Draining: info.Draining})
	}
	cfs, err := c.Get(ctx, keys.Changefeeds(), clientv3.WithPrefix())
	if err != nil {
		return err
	}
	specs := map[string]Spec{}
	assigned := map[string]Assignment{}
	revs := map[string]int64{} // assignment key -> mod revision read
	for _, kv := range cfs.Kvs {
		name, what := keys.changefeedKey(string(kv.Key))
		switch what {
		case "spec":
			var s Spec
			if json.Unmarshal(kv.Value, &s) == nil {
				specs[name] = s
			}
		case "assign":
			var a Assignment
			if json.Unmarshal(kv.Value, &a) == nil {
				assigned[name] = a
			}
			revs[name] = kv.ModRevision
		}
	}
	for name, s := range specs {
		in.Changefeeds = append(in.Changefeeds, PlaceChangefeed{Name: name, Running: s.State == StateRunning, Node: assigned[name].Node})
	}
	for name, a := range assigned {
		if _, ok := specs[name]; !ok && a.Node != "" {
			in.Changefeeds = append(in.Changefeeds, PlaceChangefeed{Name: name, Node: a.Node}) // removed: taken off its node
		}
	}
	decisions := Place(in)
	defer co.met.observe(in, decisions)
	for _, d := range decisions {
		key := keys.Assignment(d.Changefeed)
		cond := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", revs[d.Changefeed])}
		now := opts.Clock.Now().UTC()
		a := Assignment{Node: d.To, By: l.Rev(), At: now, Why: d.Why,
			History: append(assigned[d.Changefeed].History, Move{From: d.From, To: d.To, At: now, Why: d.Why})}
		a.History = a.History[max(0, len(a.History)-maxHistory):]
		b, _ := json.Marshal(a) // plain types
		op := clientv3.OpPut(key, string(b))
		if _, ok := specs[d.Changefeed]; !ok {
			op = clientv3.OpDelete(key) // removed: its assignment goes with it
		}
		if err := l.Txn(ctx, cond, op); err != nil {
			return fmt.Errorf("cluster: assign %s to %q: %w", d.Changefeed, d.To, err)
		}
		co.met.moves.WithLabelValues(string(d.Why)).Inc()
		opts.Logger.Info("changefeed assigned", zap.String("changefeed", d.Changefeed), zap.String("from", d.From), zap.String("to", d.To),
			zap.String("why", string(d.Why)))
	}
	if co.knobs.rounds != nil {
		select {
		case co.knobs.rounds <- decisions:
		case <-ctx.Done():
		}
	}
	return nil
}

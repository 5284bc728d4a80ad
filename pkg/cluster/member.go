package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/optcheck"
	"github.com/cdcflow/eventservice/pkg/clock"
)

// Membership. A node holds its key (Keys.Node) under a lease of its own
// that it keeps alive, and runs changefeeds only while Valid: before the
// local deadline, which is the time the last acknowledged keepalive was
// *sent* plus the lease's TTL minus a margin, read from the monotonic
// clock. The server's expiry is its receipt of that keepalive plus the
// TTL, later than the send, so the local deadline passes first: a node
// cut off from etcd (a partition, a pause) has stopped before its lease
// can expire and its changefeeds be given to another node. A lease lost
// is never revived: a node joins again under a new one.

// MemberOptions start a node's membership.
type MemberOptions struct {
	Client *clientv3.Client
	Keys   Keys
	NodeID string
	// Info is the node's key's value (its address, version, start).
	Info []byte
	// TTL is the lease's TTL (default 10s; etcd may grant a longer one,
	// which is then used).
	TTL time.Duration
	// Margin is taken off the local deadline, for a keepalive's send and
	// the checks of Valid being late (default TTL/5).
	Margin time.Duration
	// Clock reads the monotonic time (default the real clock).
	Clock  clock.Clock
	Logger *zap.Logger
	// Registerer, if set, receives the membership's metrics
	// (cdcflow_cluster_membership_valid, _lease_keepalive_seconds).
	Registerer prometheus.Registerer
}

// EnsureDefaults returns a copy of o with every zero field set to its
// documented default.
func (o MemberOptions) EnsureDefaults() MemberOptions {
	if o.TTL == 0 {
		o.TTL = 10 * time.Second
	}
	if o.Margin == 0 {
		o.Margin = o.TTL / 5
	}
	o.Clock = clock.OrReal(o.Clock)
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return o
}

// Validate reports what is wrong with o (after EnsureDefaults).
func (o MemberOptions) Validate() error {
	p := optcheck.New(ErrInvalidOptions)
	p.Required("MemberOptions.Client", o.Client)
	p.Require(o.NodeID != "" && !strings.Contains(o.NodeID, "/"), "MemberOptions.NodeID %q: want a name without /", o.NodeID)
	p.Require(o.TTL >= 2*time.Second, "MemberOptions.TTL %v: at least 2s (etcd's shortest lease at its default election timeout)", o.TTL)
	p.Require(o.Margin > 0 && o.Margin < o.TTL, "MemberOptions.Margin %v: more than 0 and less than the TTL %v", o.Margin, o.TTL)
	return p.Err()
}

// keepaliveRetry is how soon a failed keepalive is tried again.
const keepaliveRetry = 200 * time.Millisecond

// Member is a node's live membership.
type Member struct {
	opts  MemberOptions
	knobs testingKnobs
	wg    sync.WaitGroup
	met   *memberMetrics
	lease clientv3.LeaseID
	ttl   time.Duration
	lost  chan struct{}
	stop  chan struct{}

	mu       sync.Mutex
	deadline time.Time // local: see above
	lostWhy  error
}

// StartMember grants the lease, puts the node's key under it (refused
// with ErrNodeExists while another live node holds the ID), and starts
// keeping it alive. Close revokes it.
func StartMember(ctx context.Context, opts MemberOptions) (*Member, error) {
	opts = opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	sent := opts.Clock.Now()
	g, err := opts.Client.Grant(ctx, int64((opts.TTL+time.Second-1)/time.Second))
	if err != nil {
		return nil, fmt.Errorf("cluster: grant a lease: %w", err)
	}
	m := &Member{opts: opts, lease: g.ID, ttl: time.Duration(g.TTL) * time.Second, lost: make(chan struct{}), stop: make(chan struct{})}
	m.deadline = sent.Add(min(m.ttl, opts.TTL) - opts.Margin)
	key := opts.Keys.Node(opts.NodeID)
	resp, err := opts.Client.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(opts.Info), clientv3.WithLease(g.ID))).Commit()
	if err == nil && !resp.Succeeded {
		err = fmt.Errorf("%w: %s", ErrNodeExists, opts.NodeID)
	}
	if err == nil {
		// Registered once the node holds its ID: a start refused
		// (ErrNodeExists) and tried again registers them then.
		m.met, err = newMemberMetrics(m, opts.Registerer)
	}
	if err != nil {
		revokeCtx, cancel := context.WithTimeout(context.Background(), m.ttl)
		_, _ = opts.Client.Revoke(revokeCtx, g.ID)
		cancel()
		return nil, err
	}
	m.wg.Go(m.keepAlive)
	return m, nil
}

// Lease is the membership's lease.
func (m *Member) Lease() clientv3.LeaseID { return m.lease }

// Valid reports whether the node may act for its membership now: the
// lease not lost and the local deadline not passed.
func (m *Member) Valid() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lostWhy == nil && m.opts.Clock.Now().Before(m.deadline)
}

// Deadline is the local deadline: a write begun after it is not the
// node's to make.
func (m *Member) Deadline() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.deadline
}

// Lost is closed when the membership is lost (Err says why).
func (m *Member) Lost() <-chan struct{} { return m.lost }

// Err is why the membership was lost (nil while it is not).
func (m *Member) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lostWhy
}

// keepAlive sends a keepalive every TTL/3 and moves the local deadline
// from each acknowledged one's send; it loses the membership when the
// lease is gone or the deadline passes first.
func (m *Member) keepAlive() {
	every := m.ttl / 3
	tick := m.opts.Clock.NewTicker(every)
	defer tick.Stop()
	// Wakes at the local deadline: the loss is noticed then, not at the
	// next tick, which may be past the server's expiry.
	expiry := m.opts.Clock.NewTimer(m.Deadline().Sub(m.opts.Clock.Now()))
	defer expiry.Stop()
	failed := false
	for {
		if !m.knobs.dropKeepalives.Load() {
			sent := m.opts.Clock.Now()
			ctx, cancel := context.WithTimeout(context.Background(), every)
			resp, err := m.opts.Client.KeepAliveOnce(ctx, m.lease)
			cancel()
			switch {
			case errors.Is(err, rpctypes.ErrLeaseNotFound) || err == nil && resp.TTL <= 0:
				m.lose(fmt.Errorf("%w: etcd no longer has lease %x", ErrLeaseLost, int64(m.lease)))
				return
			case err == nil:
				m.met.keepalive.Observe(m.opts.Clock.Now().Sub(sent).Seconds())
				m.mu.Lock()
				if d := sent.Add(time.Duration(resp.TTL)*time.Second - m.opts.Margin); d.After(m.deadline) {
					m.deadline = d
				}
				m.mu.Unlock()
				expiry.Reset(m.Deadline().Sub(m.opts.Clock.Now()))
			default:
				failed = true
				m.opts.Logger.Warn("a keepalive of the node's lease failed: trying again", zap.Error(err))
			}
		}
		if !m.Valid() {
			m.lose(fmt.Errorf("%w: no keepalive acknowledged before the local deadline %v", ErrLeaseLost, m.Deadline()))
			return
		}
		// A failed keepalive is tried again soon, not at the next tick:
		// the etcd client moves to another member (one was lost) within
		// the margin then.
		var retry <-chan time.Time
		var retryTimer clock.Timer
		if failed {
			retryTimer = m.opts.Clock.NewTimer(min(every, keepaliveRetry))
			retry, failed = retryTimer.C(), false
		}
		stopRetry := func() {
			if retryTimer != nil {
				retryTimer.Stop()
			}
		}
		select {
		case <-retry:
		case <-tick.C():
		case <-expiry.C():
			if !m.Valid() {
				stopRetry()
				m.lose(fmt.Errorf("%w: no keepalive acknowledged before the local deadline %v", ErrLeaseLost, m.Deadline()))
				return
			}
		case <-m.stop:
			stopRetry()
			return
		}
		stopRetry()
	}
}

func (m *Member) lose(why error) {
	if m.end(why) {
		m.opts.Logger.Error("the node's membership is lost: it stops every changefeed it runs", zap.Error(why))
	}
}

// end ends the membership for why, once: false if it had ended.
func (m *Member) end(why error) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.lostWhy != nil {
		return false
	}
	m.lostWhy = why
	close(m.lost)
	return true
}

// Close stops the keepalives and revokes the lease (its key goes at
// once: the node's changefeeds are free for others without waiting for
// the TTL).
func (m *Member) Close() error {
	select {
	case <-m.stop:
	default:
		close(m.stop)
	}
	m.wg.Wait()
	if m.end(fmt.Errorf("%w: the node left", ErrLeaseLost)) {
		m.opts.Logger.Info("the node left the cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), m.ttl)
	defer cancel()
	if _, err := m.opts.Client.Revoke(ctx, m.lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("cluster: revoke the node's lease: %w", err)
	}
	return nil
}

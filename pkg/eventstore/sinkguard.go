package eventstore

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/cdcflow/eventservice/pkg/common"
)

// SinkGuard is the sink of one subscription plus what makes its Close
// final: after Close returns, Push never calls the sink again. It is how an
// Upstream keeps the Subscription contract (after Close returns the sink
// is called no more), and every upstream of the module uses it (the
// PostgreSQL source pkg/pgsource, and pkg/upstream's generator and Manual).
//
// A push holds mu for the duration of the sink call, and close takes mu to
// set closed, so a concurrent push either completes before close returns or
// is refused. close first cancels the push in flight, if any, through the
// cancel function the pusher registered, so a sink that blocks
// (back-pressure) but honours its context returns promptly and close stays
// bounded. The guard holds no context of its own: a million subscriptions
// must not cost a million contexts, and the generator's one driver pushes
// with one reusable context.
type SinkGuard struct {
	sink Sink
	// closing is set when close begins; push checks it after registering
	// its cancel function (under cmu), so either push sees it or close sees
	// the cancel function.
	closing atomic.Bool
	cmu     sync.Mutex
	cancel  context.CancelFunc // of the push in flight; guarded by cmu

	mu struct {
		sync.Mutex
		closed bool
	}
}

// NewSinkGuard returns a guard of sink.
func NewSinkGuard(sink Sink) *SinkGuard { return &SinkGuard{sink: sink} }

// Init makes a zero SinkGuard, held by value, a guard of sink, without the
// allocation of NewSinkGuard (a feed of a million subscriptions embeds its
// guard). It must be called before any other method, and once.
func (g *SinkGuard) Init(sink Sink) { g.sink = sink }

// IsClosed reports whether close has begun, without waiting for an
// in-flight push.
func (g *SinkGuard) IsClosed() bool { return g.closing.Load() }

// Push calls the sink with ctx, which cancel cancels (close calls it if the
// push is in flight). It returns ErrSubscriptionClosed, without calling the
// sink, once close has started.
func (g *SinkGuard) Push(ctx context.Context, cancel context.CancelFunc, b Batch) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.cmu.Lock()
	g.cancel = cancel
	closing := g.closing.Load()
	g.cmu.Unlock()
	defer func() {
		g.cmu.Lock()
		g.cancel = nil
		g.cmu.Unlock()
	}()
	if g.mu.closed || closing {
		return ErrSubscriptionClosed
	}
	return g.sink.Push(ctx, b)
}

// PushResolvedGuarded advances the sinks of guards to ts in one
// PushResolved call, each guard held for the call as Push holds
// it (so a Close waits for the call, and cancels it through cancel):
// errs[i] (len(errs) == len(guards)) is ErrSubscriptionClosed for a guard
// whose close had begun, else what the advance of its sink returned. A
// cancel by one guard's Close cancels the call for all: a caller tells the
// others' context.Canceled apart with IsClosed. The guards must be
// distinct and held by no other push of the caller's. A caller that pushes
// again and again keeps a ResolvedPusher instead, which reuses its buffers.
func PushResolvedGuarded(ctx context.Context, cancel context.CancelFunc, guards []*SinkGuard, ts common.Ts, errs []error) {
	var p ResolvedPusher
	p.Push(ctx, cancel, guards, ts, errs)
}

// ResolvedPusher is PushResolvedGuarded with buffers kept from one call to the
// next (the sinks passed on and their errors: three slices of the guards'
// length, which a caller pushing every tick would otherwise allocate per
// call). The zero value is ready; it is not safe for concurrent use.
type ResolvedPusher struct {
	sinks []Sink
	idx   []int
	errs  []error
}

// Push is PushResolvedGuarded.
func (p *ResolvedPusher) Push(ctx context.Context, cancel context.CancelFunc, guards []*SinkGuard, ts common.Ts, errs []error) {
	if len(errs) != len(guards) {
		panic("eventstore: PushResolvedGuarded with errs and guards of different lengths")
	}
	sinks, idx := p.sinks[:0], p.idx[:0]
	for i, g := range guards {
		errs[i] = nil
		g.mu.Lock()
		g.cmu.Lock()
		g.cancel = cancel
		closing := g.closing.Load()
		g.cmu.Unlock()
		if g.mu.closed || closing {
			errs[i] = ErrSubscriptionClosed
			continue
		}
		sinks = append(sinks, g.sink)
		idx = append(idx, i)
	}
	defer func() {
		for _, g := range guards {
			g.cmu.Lock()
			g.cancel = nil
			g.cmu.Unlock()
			g.mu.Unlock()
		}
		clear(sinks) // no sink kept reachable between calls
		clear(p.errs)
		p.sinks, p.idx = sinks[:0], idx[:0]
	}()
	if len(sinks) == 0 {
		return
	}
	if cap(p.errs) < len(sinks) {
		p.errs = make([]error, len(sinks))
	}
	p.errs = p.errs[:len(sinks)]
	PushResolved(ctx, sinks, ts, p.errs)
	for j, i := range idx {
		errs[i] = p.errs[j]
	}
}

// Close marks the guard closed, cancels the push in flight and waits for it.
// It reports whether this call was the one that closed it.
func (g *SinkGuard) Close() bool {
	g.closing.Store(true)
	g.cmu.Lock()
	if g.cancel != nil {
		g.cancel()
	}
	g.cmu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	first := !g.mu.closed
	g.mu.closed = true
	return first
}

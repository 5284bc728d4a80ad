package upstream

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/cdcflow/eventservice/pkg/eventstore"
)

// errSubscriptionClosed is returned by sinkGuard.push after close; it never
// leaves the package.
var errSubscriptionClosed = errors.New("upstream: subscription closed")

// sinkGuard is the sink of one subscription plus what makes its Close
// final: after close returns, push never calls the sink again.
//
// A push holds mu for the duration of the sink call, and close takes mu to
// set closed, so a concurrent push either completes before close returns or
// is refused. close first cancels the push in flight, if any, through the
// cancel function the pusher registered, so a sink that blocks
// (back-pressure) but honours its context returns promptly and close stays
// bounded. The guard holds no context of its own: a million subscriptions
// must not cost a million contexts, and the generator's one driver pushes
// with one reusable context.
type sinkGuard struct {
	sink eventstore.Sink
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

func newSinkGuard(sink eventstore.Sink) *sinkGuard { return &sinkGuard{sink: sink} }

// isClosed reports whether close has begun, without waiting for an
// in-flight push.
func (g *sinkGuard) isClosed() bool { return g.closing.Load() }

// push calls the sink with ctx, which cancel cancels (close calls it if the
// push is in flight). It returns errSubscriptionClosed, without calling the
// sink, once close has started.
func (g *sinkGuard) push(ctx context.Context, cancel context.CancelFunc, b eventstore.Batch) error {
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
		return errSubscriptionClosed
	}
	return g.sink.Push(ctx, b)
}

// close marks the guard closed, cancels the push in flight and waits for it.
// It reports whether this call was the one that closed it.
func (g *sinkGuard) close() bool {
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

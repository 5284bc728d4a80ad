package upstream

import (
	"context"
	"errors"
	"sync"

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
// is refused. close cancels ctx before taking mu, so a sink that blocks
// (back-pressure) but honours its context returns promptly and close stays
// bounded.
type sinkGuard struct {
	sink   eventstore.Sink
	ctx    context.Context
	cancel context.CancelFunc

	mu struct {
		sync.Mutex
		closed bool
	}
}

func newSinkGuard(parent context.Context, sink eventstore.Sink) *sinkGuard {
	ctx, cancel := context.WithCancel(parent)
	return &sinkGuard{sink: sink, ctx: ctx, cancel: cancel}
}

// push calls the sink with a context that is cancelled when either ctx (may
// be nil) or the guard's own context is. It returns errSubscriptionClosed,
// without calling the sink, once close has started.
func (g *sinkGuard) push(ctx context.Context, b eventstore.Batch) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	// A cancelled guard context means close has begun: start no new sink
	// call, even if close has not taken mu yet.
	if g.mu.closed || g.ctx.Err() != nil {
		return errSubscriptionClosed
	}
	pctx := g.ctx
	if ctx != nil {
		var cancel context.CancelFunc
		pctx, cancel = context.WithCancel(ctx)
		defer cancel()
		stop := context.AfterFunc(g.ctx, cancel)
		defer stop()
	}
	return g.sink.Push(pctx, b)
}

// isClosed reports whether close has begun (or the parent context ended),
// without waiting for an in-flight push.
func (g *sinkGuard) isClosed() bool { return g.ctx.Err() != nil }

// close marks the guard closed and waits for an in-flight push. It reports
// whether this call was the one that closed it.
func (g *sinkGuard) close() bool {
	g.cancel()
	g.mu.Lock()
	defer g.mu.Unlock()
	first := !g.mu.closed
	g.mu.closed = true
	return first
}

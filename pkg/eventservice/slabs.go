package eventservice

import (
	"sync"
	"sync/atomic"

	"github.com/cdcflow/eventservice/pkg/messaging"
)

// resolvedSlab is the memory of one delivery's ResolvedBatch entries,
// shared by the delivery's messages and reused once all of them are
// released. Allocated afresh per delivery, the entries were the largest
// share of the service's allocations at a million advances a second, and
// each GC cycle they brought forward took a core from the pipeline for its
// mark phase (docs/benchmarks.md, "Figures behind the code").
//
// INVARIANT: refs counts the slab's holders: the delivering pump until its
// sends are done, and each message a transport accepted until its
// receiver releases it (messaging.ResolvedBatch.Release). Only at zero,
// when nobody reads the entries any more, does the slab return to its
// pool. A receiver that never releases (a transport that encodes and
// drops the message, a dropped message, a receiver of another
// implementation) leaves refs above zero: the slab is then left to the
// garbage collector, as every slab was before, and is never reused.
type resolvedSlab struct {
	entries []messaging.Resolved
	refs    atomic.Int32
	pool    *slabPool
}

var _ messaging.Releaser = (*resolvedSlab)(nil)

// hold counts one more holder (a message about to be sent).
func (s *resolvedSlab) hold() { s.refs.Add(1) }

// Release drops one holder; the last one returns the slab to its pool.
func (s *resolvedSlab) Release() {
	switch n := s.refs.Add(-1); {
	case n == 0:
		s.pool.put(s)
	case n < 0:
		panic("eventservice: a resolved-ts slab released more often than held")
	}
}

// maxPooledSlabs bounds a target's released slabs kept for reuse: a
// collector that drains a full inbox releases a burst of them at once (an
// inbox of 8192 entries holds 16 slabs of 512), and at most this many
// wait for the next deliveries, 512 KiB at 512 entries each.
const maxPooledSlabs = 16

// slabPool keeps one target's released slabs. Its lock is taken once per
// delivery and once per release, never while holding another.
type slabPool struct {
	// size is the most entries a delivery has (the target's
	// ResolvedBatch): once the target's receiver releases, new slabs are
	// made this large, so that any of them serves any delivery. Until
	// then (a receiver that never releases: the gRPC transport) each is
	// made for its delivery, as small as it can be, since it is garbage
	// after it.
	size int
	mu   struct {
		sync.Mutex
		free      []*resolvedSlab
		recycling bool // a slab was released: the receiver releases
	}
}

// get returns a slab of n entries held once (by the caller): a released
// one large enough, or a new one.
func (p *slabPool) get(n int) *resolvedSlab {
	p.mu.Lock()
	free := p.mu.free
	for i := len(free) - 1; i >= 0; i-- {
		if s := free[i]; cap(s.entries) >= n {
			last := len(free) - 1
			free[i], free[last] = free[last], nil
			p.mu.free = free[:last]
			p.mu.Unlock()
			s.entries = s.entries[:n]
			s.refs.Store(1)
			return s
		}
	}
	size := n
	if p.mu.recycling {
		size = max(n, p.size)
	}
	p.mu.Unlock()
	s := &resolvedSlab{entries: make([]messaging.Resolved, n, size), pool: p}
	s.refs.Store(1)
	return s
}

// put keeps a released slab for reuse. A full pool keeps its largest
// slabs: a small one it dropped for a larger could serve only small
// deliveries, and a pool of small ones would leave every large delivery
// to allocate.
func (p *slabPool) put(s *resolvedSlab) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mu.recycling = true
	if cap(s.entries) == 0 {
		return
	}
	if len(p.mu.free) < maxPooledSlabs {
		p.mu.free = append(p.mu.free, s)
		return
	}
	smallest := 0
	for i, f := range p.mu.free {
		if cap(f.entries) < cap(p.mu.free[smallest].entries) {
			smallest = i
		}
	}
	if cap(s.entries) > cap(p.mu.free[smallest].entries) {
		p.mu.free[smallest] = s
	}
}

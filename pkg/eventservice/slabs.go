package eventservice

import (
	"sync"
	"sync/atomic"

	"github.com/cdcflow/eventservice/pkg/messaging"
)

// resolvedSlab is the memory of one delivery's ResolvedBatch entries,
// shared by the delivery's messages and reused once all of them are
// released. At a million advances a second the entries, allocated afresh
// per delivery, were half of the service's allocations (a 10k-table
// cdcserver run: 624 of 1235 MB), and each GC cycle they brought forward
// took a core from the pipeline for its mark phase.
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
	mu   sync.Mutex
	free []*resolvedSlab
}

// get returns a slab of n entries held once (by the caller): a released
// one large enough, or a new one.
func (p *slabPool) get(n int) *resolvedSlab {
	p.mu.Lock()
	for i := len(p.free) - 1; i >= 0; i-- {
		if s := p.free[i]; cap(s.entries) >= n {
			last := len(p.free) - 1
			p.free[i], p.free[last] = p.free[last], nil
			p.free = p.free[:last]
			p.mu.Unlock()
			s.entries = s.entries[:n]
			s.refs.Store(1)
			return s
		}
	}
	p.mu.Unlock()
	s := &resolvedSlab{entries: make([]messaging.Resolved, n), pool: p}
	s.refs.Store(1)
	return s
}

// put keeps a released slab for reuse, unless the pool is full.
func (p *slabPool) put(s *resolvedSlab) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) < maxPooledSlabs {
		p.free = append(p.free, s)
	}
}

package eventservice

import (
	"sync"

	"github.com/cdcflow/eventservice/pkg/common"
)

// blockedSet holds the sessions parked in schemaBlocked, each waiting for
// the schema frontier to pass its blockedAt. The schema store's callback
// only rings the doorbell; runSchemaRetry re-queues whoever can go on, so a
// held dispatcher never needs a store notification to recover.
type blockedSet struct {
	mu struct {
		sync.Mutex
		sessions map[*session]struct{}
	}
	doorbell chan struct{}
}

func newBlockedSet() *blockedSet {
	b := &blockedSet{doorbell: make(chan struct{}, 1)}
	b.mu.sessions = make(map[*session]struct{})
	return b
}

func (b *blockedSet) ring() {
	select {
	case b.doorbell <- struct{}{}:
	default:
	}
}

func (b *blockedSet) add(s *session) {
	b.mu.Lock()
	b.mu.sessions[s] = struct{}{}
	b.mu.Unlock()
}

func (b *blockedSet) remove(s *session) {
	b.mu.Lock()
	delete(b.mu.sessions, s)
	b.mu.Unlock()
}

func (b *blockedSet) len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.mu.sessions)
}

// takeReady removes and returns the sessions whose wait the frontier ended.
func (b *blockedSet) takeReady(frontier common.Ts, dst []*session) []*session {
	b.mu.Lock()
	defer b.mu.Unlock()
	for s := range b.mu.sessions {
		if common.Ts(s.blockedAt.Load()) < frontier {
			delete(b.mu.sessions, s)
			dst = append(dst, s)
		}
	}
	return dst
}

// park puts s, which just entered schemaBlocked waiting for the frontier to
// pass at, into the blocked set. It then reads the frontier again: an
// advance that happened between the owner's decision and the insertion
// would otherwise ring a doorbell before s was there to be found. It also
// reads s's state again: a retire between the owner's transition and the
// insertion removed s from the set before it was there, and a removed
// session left in the set would stay until the frontier passes at, which
// for a dropped table may be never.
func (svc *Service) park(s *session, at common.Ts) {
	svc.knobs.reach(pointBeforePark, s, nil)
	s.blockedAt.Store(uint64(at))
	svc.blocked.add(s)
	if st, _ := s.sched.load(); st == stateRemoved {
		svc.blocked.remove(s)
		return
	}
	if svc.opts.Schema.ResolvedTs() > at {
		svc.blocked.remove(s)
		svc.unblock(s)
	}
}

// unblock re-queues a session whose schema wait ended.
func (svc *Service) unblock(s *session) {
	if act, _ := s.sched.fire(evSchemaAdvanced); act == actEnqueuePrepare {
		svc.enqueue(s)
	}
}

// runSchemaRetry re-queues schema-blocked sessions when the frontier moves.
func (svc *Service) runSchemaRetry() {
	var ready []*session
	for {
		select {
		case <-svc.blocked.doorbell:
		case <-svc.closing:
			return
		}
		ready = svc.retryBlocked(ready)
	}
}

// retryBlocked re-queues the schema-blocked sessions the frontier passed
// (one round of runSchemaRetry); ready is scratch space, returned for reuse.
func (svc *Service) retryBlocked(ready []*session) []*session {
	ready = svc.blocked.takeReady(svc.opts.Schema.ResolvedTs(), ready[:0])
	for _, s := range ready {
		svc.unblock(s)
	}
	clear(ready)
	return ready[:0]
}

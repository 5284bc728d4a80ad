package eventservice

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/cdcflow/eventservice/internal/touchahead"
	"github.com/cdcflow/eventservice/pkg/clock"
)

// keepaliveSet tracks the sessions that published progress, so that the
// keepalive loop looks only at them, never at every dispatcher. A session
// enters the current generation's list once, when it publishes (or is
// touched by a keepalive); each SignalInterval the loop swaps in a new
// generation and examines the previous list. A session examined there is
// dropped when it published again since (it is in the new list), when it
// is retired, or when its collector acknowledged its progress; it is
// carried over when its progress is still younger than SignalInterval;
// otherwise it gets a keepalive, which touches it into the new list. The
// work per interval is thus the number of sessions that published in the
// interval before, plus the unacknowledged ones: it follows change.
type keepaliveSet struct {
	// gen is the current generation; a session whose kaGen equals it is in
	// cur. Written under mu only.
	gen atomic.Uint64
	mu  struct {
		sync.Mutex
		cur []*session
	}
}

// note puts s into the current generation's list unless it is there.
func (k *keepaliveSet) note(s *session) {
	if s.kaGen.Load() == k.gen.Load() {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	g := k.gen.Load()
	if s.kaGen.Load() == g {
		return
	}
	s.kaGen.Store(g)
	k.mu.cur = append(k.mu.cur, s)
}

// noteAll notes every session of ss, under one lock.
func (k *keepaliveSet) noteAll(ss []*session) {
	if len(ss) == 0 {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	g := k.gen.Load()
	for _, s := range ss {
		if s.kaGen.Load() != g {
			s.kaGen.Store(g)
			k.mu.cur = append(k.mu.cur, s)
		}
	}
}

// swap starts a new generation and returns the previous list; spare is
// reused for the new one.
func (k *keepaliveSet) swap(spare []*session) []*session {
	k.mu.Lock()
	defer k.mu.Unlock()
	prev := k.mu.cur
	k.mu.cur = spare[:0]
	k.gen.Add(1)
	return prev
}

// len returns the size of the current list.
func (k *keepaliveSet) len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.mu.cur)
}

// runKeepalive re-sends, every SignalInterval, the published progress of
// sessions whose collector has not acknowledged it by heartbeat for a whole
// interval. If the last message of a dispatcher was dropped, no later
// message would ever reveal the seq gap and the collector would wait
// forever: the keepalive's resolved-ts carries the current seq, the
// collector sees the gap and resets.
func (svc *Service) runKeepalive(t clock.Ticker) {
	defer t.Stop()
	var spare []*session
	for {
		select {
		case <-t.C():
		case <-svc.closing:
			return
		}
		spare = svc.keepaliveRound(spare)
	}
}

// keepaliveRound is one round of the keepalive loop: it swaps in a new
// generation (its list in spare's storage) and examines the previous one's
// sessions; it returns that list's storage, the next round's spare.
func (svc *Service) keepaliveRound(spare []*session) []*session {
	prev := svc.kaSet.swap(spare)
	now := svc.opts.Clock.Now()
	gen := svc.kaSet.gen.Load()
	carry := svc.kaCarry[:0]
	for rest := prev; len(rest) > 0; {
		chunk := rest[:min(len(rest), touchahead.Chunk)]
		rest = rest[len(chunk):]
		for _, s := range chunk { // touch ahead: the lines examine reads first
			s.kaGen.Load()
			s.sched.w.Load()
			s.pubAt.Load()
		}
		for _, s := range chunk {
			if s.kaGen.Load() != gen && svc.examine(s, now) {
				carry = append(carry, s)
			}
		}
	}
	svc.kaSet.noteAll(carry) // one lock for the round's carry-overs, not one each
	clear(carry)
	svc.kaCarry = carry[:0]
	if k := svc.knobs.keepaliveRound; k != nil {
		k(len(prev))
	}
	clear(prev)
	return prev[:0]
}

// keepalive examines s, which published progress in an earlier interval:
// a keepalive if that progress is unacknowledged and SignalInterval old,
// a carry-over into the current list if it is younger.
func (svc *Service) keepalive(s *session, now time.Time) {
	if svc.examine(s, now) {
		svc.kaSet.note(s)
	}
}

// examine is keepalive without the carry-over: it reports whether s is to
// be looked at again next interval (the round notes those in one go).
func (svc *Service) examine(s *session, now time.Time) (carry bool) {
	st, _ := s.sched.load()
	if st == stateRemoved {
		return false
	}
	at := s.pubAt.Load()
	if at == 0 {
		return false // never published (not in a list by itself)
	}
	if time.Duration(svc.sinceBase(now)-at) < svc.opts.SignalInterval || inPipeline(st) || s.inSet.Load() {
		// Young progress, a preparation or scan under way that will publish
		// anew or return the session to rest, or progress still waiting in
		// the resolved set, which delivers it (under overload
		// acknowledgements lag, and a keepalive then would only add to the
		// load, merging into values not yet delivered): look again next
		// interval. A session parked (schema blocked, backing off) is not
		// skipped: it may stay parked for good, and its last message may be
		// the lost one.
		return true
	}
	ts, seq, _ := s.published()
	d := s.d
	d.mu.Lock()
	acked := d.mu.checkpoint >= ts && !d.mu.needRegister
	d.mu.Unlock()
	if acked || d.session.Load() != s {
		return false
	}
	s.touch(now)
	svc.metrics.keepalives.Inc()
	s.inSet.Store(true)
	d.target.resolved.Add(d.id, resolvedValue{s: s, epoch: s.epoch, seq: seq, ts: ts})
	return false
}

// sinceBase is now as an offset from the service's clock base.
func (svc *Service) sinceBase(now time.Time) int64 { return int64(now.Sub(svc.clockBase)) }

// inPipeline reports whether a session in state st is being prepared or
// scanned, or queued for it: states it leaves on its own, soon.
func inPipeline(st scanState) bool {
	switch st {
	case statePrepareQueued, statePreparing, stateScanQueued, stateScanning:
		return true
	}
	return false
}

// storeMaxInt64 raises a to v if v is larger.
func storeMaxInt64(a *atomic.Int64, v int64) {
	for {
		old := a.Load()
		if v <= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}

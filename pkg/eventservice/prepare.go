package eventservice

import (
	"errors"
	"time"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// runPrepareWorker drains preparation queue i: for each session it decides
// between nothing to do, the no-scan fast path, and a real scan.
func (svc *Service) runPrepareWorker(i int) {
	q := svc.prepQueues[i]
	for {
		select {
		case <-q.doorbell:
		case <-svc.closing:
			return
		}
		for s := q.pop(); s != nil; s = q.pop() {
			if act, _ := s.sched.fire(evPopPrepare); act != actOwn {
				continue // removed while queued
			}
			if !svc.prepare(s) {
				return // closing while waiting for the scan channel
			}
			select {
			case <-svc.closing:
				return
			default:
			}
		}
	}
}

// prepareOutcome labels what preparation decided, for metrics and tests.
type prepareOutcome uint8

const (
	outcomeNothing prepareOutcome = iota
	outcomeFastPath
	outcomeScan
	outcomeSchemaBlocked
	outcomeBackoff
	numOutcomes
)

var outcomeNames = [numOutcomes]string{"nothing", "fast_path", "scan", "schema_blocked", "backoff"}

// prepare runs one preparation of s, which the caller owns (preparing). It
// returns false only if the service closed while it waited to hand s to
// the scan channel.
func (svc *Service) prepare(s *session) bool {
	if h := svc.hooks.beforePrepare; h != nil {
		h(s)
	}
	out := svc.decide(s)
	svc.metrics.prepareOutcomes[out].Inc()
	if h := svc.hooks.prepared; h != nil {
		defer h(s, out)
	}
	switch out {
	case outcomeScan:
		act, _ := s.sched.fire(evPrepareScan)
		if act != actSendScan {
			return true // removed meanwhile
		}
		svc.scanPending.Add(1)
		select {
		case svc.scanCh <- s:
			return true
		default:
		}
		if h := svc.hooks.scanChannelFull; h != nil {
			h(s)
		}
		// The preparation worker may wait here; the notifier never does.
		select {
		case svc.scanCh <- s:
			return true
		case <-svc.closing:
			svc.scanPending.Add(-1)
			return false
		}
	case outcomeSchemaBlocked:
		if act, _ := s.sched.fire(evSchemaBlock); act == actPark {
			svc.park(s, common.Ts(s.blockedAt.Load()))
		}
	case outcomeBackoff:
		svc.backOff(s)
	default:
		if act, _ := s.sched.fire(evPrepareIdle); act == actEnqueuePrepare {
			svc.enqueue(s)
		}
	}
	return true
}

// decide looks at s's frontier and progress and does the cheap work itself:
// the handshake, and the no-scan fast path. REQUIRES: s owned.
func (svc *Service) decide(s *session) prepareOutcome {
	d, p := s.d, &s.progress
	if st, _ := s.sched.load(); st == stateRemoved {
		return outcomeNothing // reset or removed while queued: send nothing
	}
	if !svc.ensureStoreRegistration(d) {
		return outcomeBackoff
	}
	if p.seq == 0 {
		hs := &messaging.Handshake{Header: messaging.Header{Dispatcher: d.id, Registration: d.reg, Epoch: s.epoch, Seq: 1}, StartTs: s.startTs}
		switch err := svc.sendOwned(s, []messaging.Message{hs}); {
		case errors.Is(err, errRetired):
			return outcomeNothing // the transition discards it
		case err != nil:
			return outcomeBackoff
		}
		p.seq = 1
		s.backoffN = 0
		s.publish(s.startTs, 1, svc.opts.Clock.Now())
	}
	// received before maxCommit: see dispatcher.received.
	received := common.Ts(d.received.Load())
	maxCommit := common.Ts(d.maxCommit.Load())
	schemaTs, lastDDL := svc.opts.Schema.TableState(d.span.TableID)
	dec := decideScan(decideInput{resolved: p.resolved, cursor: p.cursor != nil, received: received, maxCommit: maxCommit,
		schemaTs: schemaTs, lastDDL: lastDDL})
	if dec.advance != 0 {
		p.resolved = dec.advance
		s.sent.Store(uint64(dec.advance))
		d.target.resolved.Add(d.id, resolvedValue{s: s, epoch: s.epoch, seq: p.seq, ts: dec.advance})
		s.publish(dec.advance, p.seq, svc.opts.Clock.Now())
	}
	if dec.outcome == outcomeSchemaBlocked {
		s.blockedAt.Store(uint64(dec.blockedAt))
	}
	return dec.outcome
}

// decideInput is what preparation decides from: the session's progress,
// what the store holds for the dispatcher and the table's schema state.
type decideInput struct {
	resolved  common.Ts // progress: delivered up to here
	cursor    bool      // progress: a resume position above resolved
	received  common.Ts // the store's resolved-ts notified for the dispatcher
	maxCommit common.Ts // the largest commit-ts of its rows (a hint)
	schemaTs  common.Ts // the table's schema frontier
	lastDDL   common.Ts // the commit-ts of its last DDL
}

// decision is what preparation does: its outcome, a resolved-ts to deliver
// without a scan (advance, zero for none; the fast path), and for
// outcomeSchemaBlocked the ts the schema frontier must pass.
type decision struct {
	outcome   prepareOutcome
	advance   common.Ts
	blockedAt common.Ts
}

// decideScan is the pure part of preparation (traced by
// testdata/decide): no I/O, no session, its result a function of in alone.
func decideScan(in decideInput) decision {
	if in.cursor {
		return decision{outcome: outcomeScan} // a split transaction or an interrupted commit-ts
	}
	end := min(in.received, in.schemaTs)
	if end <= in.resolved {
		if in.received > in.resolved && in.schemaTs <= in.resolved {
			// Wait for the frontier to pass what was already delivered:
			// any earlier advance could not let this dispatcher move.
			return decision{outcome: outcomeSchemaBlocked, blockedAt: in.resolved}
		}
		return decision{outcome: outcomeNothing}
	}
	// Fast path: no row and no DDL in (resolved, end]. The test is strict:
	// rows at commit-ts == resolved were delivered (several transactions
	// may share a commit-ts, and an interrupted one leaves a cursor, handled
	// above), but a row at resolved+1 must not be skipped, so the bound is
	// maxCommit <= resolved, never maxCommit < end.
	if in.maxCommit <= in.resolved && in.lastDDL <= in.resolved {
		if end < in.received {
			return decision{outcome: outcomeSchemaBlocked, advance: end, blockedAt: end}
		}
		return decision{outcome: outcomeFastPath, advance: end}
	}
	return decision{outcome: outcomeScan}
}

// backOff parks s until its back-off delay expires. REQUIRES: s owned.
// A send refused as busy waits for the target to have room again when the
// transport can say so (roomWatch); anything else waits out a timed
// back-off.
func (svc *Service) backOff(s *session) {
	busy := s.refusedBusy
	s.refusedBusy = false
	room := s.d.target.room
	var delay time.Duration
	if !busy || room == nil {
		delay = svc.backoffDelay(s) // while still the owner of backoffN
	}
	if act, _ := s.sched.fire(evBackoff); act == actArmBackoff {
		svc.metrics.backoffs.Inc()
		if busy && room != nil {
			room.wait(s)
			return
		}
		svc.backoff.arm(s, delay)
	}
}

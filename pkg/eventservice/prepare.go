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
	end := min(received, schemaTs)
	if p.cursor != nil {
		return outcomeScan // a split transaction or an interrupted commit-ts
	}
	if end <= p.resolved {
		if received > p.resolved && schemaTs <= p.resolved {
			// Wait for the frontier to pass what was already delivered:
			// any earlier advance could not let this dispatcher move.
			s.blockedAt.Store(uint64(p.resolved))
			return outcomeSchemaBlocked
		}
		return outcomeNothing
	}
	// Fast path: no row and no DDL in (resolved, end]. The test is strict:
	// rows at commit-ts == resolved were delivered (several transactions
	// may share a commit-ts, and an interrupted one leaves a cursor, handled
	// above), but a row at resolved+1 must not be skipped, so the bound is
	// maxCommit <= resolved, never maxCommit < end.
	if maxCommit <= p.resolved && lastDDL <= p.resolved {
		p.resolved = end
		s.sent.Store(uint64(end))
		d.target.resolved.Add(d.id, resolvedValue{s: s, epoch: s.epoch, seq: p.seq, ts: end})
		s.publish(end, p.seq, svc.opts.Clock.Now())
		if end < received {
			s.blockedAt.Store(uint64(end))
			return outcomeSchemaBlocked
		}
		return outcomeFastPath
	}
	return outcomeScan
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

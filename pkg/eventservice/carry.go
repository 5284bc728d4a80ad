package eventservice

import (
	"errors"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// The thin layer around the core (core.go): a worker that owns a session
// observes what a step needs, steps, and carries the effects out, feeding
// each send's result back as the next input, until the end effect.

// ownerWork is a worker's reusable state for carrying out steps.
type ownerWork struct {
	fx []effect
	sc *scanner // a scan worker's; nil for a preparation worker
	// batch is a preparation worker's (prepareBatch).
	batch prepBatch
}

// run steps s's owner state from in until an end effect is carried out. It
// returns false only if the service closed while the worker waited to hand
// s to the scan channel. REQUIRES: s owned.
func (svc *Service) run(w *ownerWork, s *session, in input) bool {
	w.fx = s.own.step(in, w.fx[:0])
	if k := svc.knobs.stepped; k != nil {
		k(s, in, w.fx)
	}
	return svc.runFrom(w, s, in, w.fx)
}

// runFrom is run once the step of in has produced fx.
func (svc *Service) runFrom(w *ownerWork, s *session, in input, fx []effect) bool {
	for {
		next, more, ok := svc.carry(w, s, fx)
		if !more {
			return ok
		}
		if next.kind == inScanSent {
			next.read = in.read // the scan the send belongs to
		}
		in = next
		w.fx = s.own.step(in, w.fx[:0])
		if k := svc.knobs.stepped; k != nil {
			k(s, in, w.fx)
		}
		fx = w.fx
	}
}

// carry carries out fx in order. A send is always a step's last effect:
// carry returns its result as the next input (more). An end effect is too:
// carry returns whether the worker may go on (ok).
func (svc *Service) carry(w *ownerWork, s *session, fx []effect) (next input, more, ok bool) {
	d := s.d
	for _, e := range fx {
		switch e.kind {
		case fxSendHandshake:
			hs := &messaging.Handshake{Header: messaging.Header{Dispatcher: d.id, Registration: d.reg, Epoch: s.epoch, Seq: e.seq}, StartTs: e.ts, Slot: d.slot}
			res := sendResultOf(svc.sendOwned(s, []messaging.Message{hs}))
			return input{kind: inHandshakeSent, sent: res, obs: svc.observe(s)}, true, true
		case fxAddResolved:
			s.sent.Store(uint64(e.ts)) // before the pump can deliver it
			s.inSet.Store(true)
			d.target.resolved.Add(d.id, resolvedValue{s: s, epoch: s.epoch, seq: e.seq, ts: e.ts})
		case fxPublish:
			s.publish(e.ts, e.seq, svc.opts.Clock.Now())
		case fxSendScan:
			return input{kind: inScanSent, sent: svc.sendScan(w.sc, s, e)}, true, true
		case fxEndPrepare:
			svc.metrics.prepareOutcomes[e.outcome].Inc() // counted before the end is observable
			ok := svc.endPrepare(s, e)
			return input{}, false, ok
		case fxEndScan:
			ok := svc.end(s, e)
			switch scanOutcome(e.outcome) {
			case scanInterrupted:
				svc.metrics.interruptedScans.Inc()
			case scanNoRoom:
				svc.metrics.deferredScans.Inc()
			}
			if k := svc.knobs.ended; k != nil {
				k(s, e)
			}
			return input{}, false, ok
		}
	}
	panic("eventservice: a step ended without a send or an end effect")
}

// endPrepare carries out a preparation's end effect e; see end. The
// caller counts its outcome.
func (svc *Service) endPrepare(s *session, e effect) bool {
	ok := svc.end(s, e)
	if k := svc.knobs.ended; k != nil {
		k(s, e)
	}
	return ok
}

// observe reads what preparation decides from: whether s was retired, and
// the dispatcher's frontier and its table's schema state.
func (svc *Service) observe(s *session) observation {
	if st, _ := s.sched.load(); st == stateRemoved {
		return observation{removed: true}
	}
	d := s.d
	// received before maxCommit: see dispatcher.received.
	obs := observation{received: common.Ts(d.received.Load()), maxCommit: common.Ts(d.maxCommit.Load())}
	obs.schemaTs, obs.lastDDL = svc.opts.Schema.TableState(d.span.Table())
	return obs
}

// sendScan sends the scan's messages (sc.msgs), with e's resolved-ts
// appended when it has one. sent caps heartbeats: it is raised before the
// send because the receiver may apply the messages and heartbeat their
// checkpoint before Send even returns here, and lowered again if the send
// fails (a receiver cannot heartbeat what it never got).
func (svc *Service) sendScan(sc *scanner, s *session, e effect) sendResult {
	var prevSent uint64
	if e.ts != 0 {
		sc.msgs = append(sc.msgs, &messaging.Resolved{Header: sc.header(s, e.seq), Ts: e.ts, Slot: s.d.collectorSlot})
		prevSent = s.sent.Swap(uint64(e.ts))
	}
	nmsgs := len(sc.msgs)
	err := svc.sendOwned(s, sc.msgs)
	sc.reset()
	if err == nil {
		return sentOK
	}
	if e.ts != 0 {
		s.sent.Store(prevSent)
	}
	if errors.Is(err, messaging.ErrBatchTooLarge) {
		// A configuration error, not congestion: the task's limits
		// (MaxMessagesPerTask) exceed what the target can ever accept.
		// Retrying cannot help until they are lowered, so say so loudly.
		// (A byte bound refuses only while the target holds others: a task
		// beyond it, ScanLimitBytes or a row larger than any bound, goes
		// in alone into an empty inbox; messaging.InProcessOptions.MaxBytes.)
		svc.log.Error("scan task larger than the target's capacity; lower the task limits",
			zap.Stringer("dispatcher", s.d.id), zap.String("target", string(s.d.target.name)),
			zap.Int("messages", nmsgs), zap.Error(err))
	}
	return sendResultOf(err)
}

func sendResultOf(err error) sendResult {
	switch {
	case err == nil:
		return sentOK
	case errors.Is(err, errRetired):
		return sentRetired
	case errors.Is(err, messaging.ErrBusy):
		return sentBusy
	}
	return sentFailed
}

// end fires the end effect's event and carries out what the transition
// says. It returns false only if the service closed while s waited to enter
// the scan channel.
func (svc *Service) end(s *session, e effect) bool {
	if e.ev == evSchemaBlock {
		s.blockedAt.Store(uint64(e.blockedAt))
	}
	act, _ := s.sched.fire(e.ev)
	switch act {
	case actEnqueuePrepare:
		svc.enqueue(s)
	case actSendScan:
		return svc.toScanChannel(s)
	case actPark:
		svc.park(s, e.blockedAt)
	case actArmBackoff:
		svc.metrics.backoffs.Inc()
		if e.room {
			s.d.target.room.wait(s)
		} else {
			svc.backoff.arm(s, svc.backoffDelay(e.attempt))
		}
	}
	return true
}

// toScanChannel hands s (scan_queued) to the scan workers. The preparation
// worker may wait here; the notifier never does.
func (svc *Service) toScanChannel(s *session) bool {
	svc.scanPending.Add(1)
	select {
	case svc.scanCh <- s:
		return true
	default:
	}
	svc.knobs.reach(pointScanChannelFull, s, nil)
	select {
	case svc.scanCh <- s:
		return true
	case <-svc.closing:
		svc.scanPending.Add(-1)
		return false
	}
}

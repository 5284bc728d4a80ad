package eventservice

import (
	"fmt"

	"github.com/cdcflow/eventservice/pkg/common"
)

// The core: two pure functions decide everything a session does.
//
//   - transition (state.go) applies an event to the session's scheduling
//     word, which every goroutine shares: a notification, a pop, a scan's
//     end, the schema frontier or a back-off ending, room again, a remove.
//     It is fired by compare-and-swap, so the notify path takes no lock.
//   - owner.step (this file) applies an input to the state only the
//     session's owner (the worker holding preparing or scanning) touches:
//     its progress, its back-off count. It returns the effects to carry out,
//     in order, and does no I/O: what it needs from outside (the store's
//     frontier, the schema, a send's result) comes in with the input.
//
// The workers are the thin layer around them (carry.go): they observe,
// step, and carry the effects out (sends, the resolved-set add, parking,
// the transitions), feeding each result back as the next input. A
// preparation or a scan is such a loop of steps; it ends with exactly one
// end effect, which fires the scheduling word's event. testdata/session
// traces the two together over a whole service.

// input is an event for a session's owner.
type input struct {
	kind inputKind
	// obs: inPrepare and inHandshakeSent.
	obs observation
	// sent: inHandshakeSent and inScanSent.
	sent sendResult
	// read: inScanRead, and inScanSent (the read whose messages were sent:
	// the worker hands it back, so the session need not hold it).
	read scanRead
}

type inputKind uint8

const (
	// inPrepare: a preparation worker owns the session.
	inPrepare inputKind = iota
	// inHandshakeSent: the handshake's send returned.
	inHandshakeSent
	// inScanRead: a scan worker read the session's range and built its
	// messages (or failed to).
	inScanRead
	// inScanSent: the scan's messages' send returned.
	inScanSent
)

var inputNames = [...]string{"prepare", "handshake_sent", "scan_read", "scan_sent"}

// observation is what preparation reads from outside the session.
type observation struct {
	removed   bool      // the session was retired while queued
	received  common.Ts // the store's resolved-ts notified for the dispatcher
	maxCommit common.Ts // the largest commit-ts of its rows (a hint)
	schemaTs  common.Ts // the table's schema frontier
	lastDDL   common.Ts // the commit-ts of its last DDL
}

// sendResult is how a send of the owner ended.
type sendResult uint8

const (
	sentOK      sendResult = iota
	sentRetired            // the session was retired first: nothing was sent
	sentBusy               // the target refused: it is full
	sentFailed             // any other failure
)

var sendResultNames = [...]string{"ok", "retired", "busy", "failed"}

// scanRead is what a scan read: the progress its messages reach if they
// are accepted, and what it read the range against.
type scanRead struct {
	failed   bool      // the store or the schema store erred
	noRoom   bool      // the target had no room: nothing was read (see scanOne)
	nothing  bool      // the range was empty: nothing read, nothing to send
	msgs     int       // messages built (the resolved-ts is not among them)
	next     progress  // the progress the messages reach
	cut      bool      // stopped at a limit: more to read
	received common.Ts // the store's frontier the range was read against
	schemaTs common.Ts // the schema frontier likewise
}

// effect is one thing a step asks its worker to do.
type effect struct {
	kind effectKind
	// ts and seq: the progress fxAddResolved, fxPublish and fxSendScan
	// carry (fxSendScan: ts is the resolved-ts to append, zero for none).
	ts  common.Ts
	seq uint64
	// The end effects': the event to fire and the outcome to count.
	ev      event
	outcome uint8 // prepareOutcome for fxEndPrepare, scanOutcome for fxEndScan
	// blockedAt: evSchemaBlock's wait. room and attempt: evBackoff's wait,
	// for room again (a busy refusal the target can signal the end of) or
	// a timed delay of back-off attempt attempt.
	blockedAt common.Ts
	room      bool
	attempt   int
}

type effectKind uint8

const (
	// fxSendHandshake: send the epoch's handshake (seq 1); step
	// inHandshakeSent with the result and a fresh observation.
	fxSendHandshake effectKind = iota
	// fxAddResolved: publish ts as sent and hand (ts, seq) to the target's
	// resolved set, which never refuses.
	fxAddResolved
	// fxPublish: record (ts, seq) as delivered progress (keepalives).
	fxPublish
	// fxSendScan: send the scan's messages, with a resolved-ts ts appended
	// when ts is set; step inScanSent with the result.
	fxSendScan
	// fxEndPrepare, fxEndScan: fire ev, then carry out what the transition
	// says (enqueue, the scan channel, park, back off), and count outcome.
	fxEndPrepare
	fxEndScan
)

var effectNames = [...]string{"send_handshake", "add_resolved", "publish", "send_scan", "end_prepare", "end_scan"}

// owner is the session state only its owner reads or writes.
type owner struct {
	progress progress
	// backoffN counts consecutive failed sends (the back-off's exponent).
	backoffN int
	// busy: the last send was refused as busy.
	busy bool
	// roomSignal: the target can say when it has room again (a busy
	// refusal then waits for that instead of a timer).
	roomSignal bool
	// startTs is the epoch's start (the handshake's); immutable.
	startTs common.Ts
}

// step applies in to o and appends the effects to carry out to fx.
// Pure: no I/O, no clock, no shared state.
func (o *owner) step(in input, fx []effect) []effect {
	switch in.kind {
	case inPrepare:
		if in.obs.removed {
			return append(fx, endPrepare(outcomeNothing)) // reset or removed while queued: send nothing
		}
		if o.progress.seq == 0 {
			return append(fx, effect{kind: fxSendHandshake, ts: o.startTs, seq: 1})
		}
		return o.decide(in.obs, fx)
	case inHandshakeSent:
		o.busy = in.sent == sentBusy
		switch in.sent {
		case sentOK:
		case sentRetired:
			return append(fx, endPrepare(outcomeNothing)) // the transition discards it
		default:
			return append(fx, o.backoff(fxEndPrepare, uint8(outcomeBackoff)))
		}
		o.progress.seq = 1
		o.backoffN = 0
		fx = append(fx, effect{kind: fxPublish, ts: o.startTs, seq: 1})
		return o.decide(in.obs, fx)
	case inScanRead:
		return o.scanRead(in.read, fx)
	case inScanSent:
		o.busy = in.sent == sentBusy
		switch in.sent {
		case sentOK:
			return o.accepted(in.read, fx)
		case sentRetired:
			return append(fx, endScan(evScanDone, scanDone, 0)) // the transition discards it
		}
		return append(fx, o.backoff(fxEndScan, uint8(scanFailed)))
	}
	panic(fmt.Sprintf("eventservice: step of unknown input %d", in.kind))
}

// decide is preparation's step once the handshake is out.
func (o *owner) decide(obs observation, fx []effect) []effect {
	p := &o.progress
	dec := decideScan(decideInput{resolved: p.resolved, cursor: p.cursor != nil, received: obs.received,
		maxCommit: obs.maxCommit, schemaTs: obs.schemaTs, lastDDL: obs.lastDDL})
	if dec.advance != 0 {
		p.resolved = dec.advance
		fx = append(fx, effect{kind: fxAddResolved, ts: dec.advance, seq: p.seq},
			effect{kind: fxPublish, ts: dec.advance, seq: p.seq})
	}
	switch dec.outcome {
	case outcomeScan:
		return append(fx, effect{kind: fxEndPrepare, ev: evPrepareScan, outcome: uint8(outcomeScan)})
	case outcomeSchemaBlocked:
		return append(fx, effect{kind: fxEndPrepare, ev: evSchemaBlock, outcome: uint8(outcomeSchemaBlocked), blockedAt: dec.blockedAt})
	}
	return append(fx, endPrepare(dec.outcome))
}

// scanRead is a scan's step once its range is read.
func (o *owner) scanRead(r scanRead, fx []effect) []effect {
	p := o.progress
	switch {
	case r.failed:
		return append(fx, o.backoff(fxEndScan, uint8(scanFailed)))
	case r.noRoom:
		// What a busy refusal of the send would have said, before the
		// read it would have thrown away.
		o.busy = true
		return append(fx, o.backoff(fxEndScan, uint8(scanNoRoom)))
	case r.nothing:
		return append(fx, idleOrBlocked(r.received, r.schemaTs, p.resolved))
	}
	if r.msgs == 0 {
		// Nothing but progress: it goes through the resolved set like the
		// fast path, so resolved-ts of one seq leave in order.
		if r.next.resolved > p.resolved {
			fx = append(fx, effect{kind: fxAddResolved, ts: r.next.resolved, seq: r.next.seq})
		}
		return o.accepted(r, fx)
	}
	send := effect{kind: fxSendScan, seq: r.next.seq}
	if r.next.resolved > p.resolved {
		send.ts = r.next.resolved
	}
	return append(fx, send)
}

// accepted publishes the progress of scan r as one step, then ends the scan.
func (o *owner) accepted(r scanRead, fx []effect) []effect {
	p := o.progress
	o.progress = r.next
	o.backoffN = 0
	if r.next.resolved > p.resolved || r.next.seq > p.seq {
		fx = append(fx, effect{kind: fxPublish, ts: r.next.resolved, seq: r.next.seq})
	}
	if r.cut {
		return append(fx, endScan(evScanInterrupted, scanInterrupted, 0))
	}
	return append(fx, idleOrBlocked(r.received, r.schemaTs, r.next.resolved))
}

// idleOrBlocked ends a finished scan: the schema frontier may be what holds
// data back.
func idleOrBlocked(received, schemaTs, resolved common.Ts) effect {
	if received > resolved && schemaTs <= resolved {
		return endScan(evSchemaBlock, scanBlocked, resolved) // nothing moves until the frontier passes resolved
	}
	return endScan(evScanDone, scanDone, 0)
}

// backoff ends a preparation or scan whose send (or read) failed. A busy
// refusal waits for room again when the target can say so; anything else
// waits out a timed back-off of the next attempt.
func (o *owner) backoff(kind effectKind, outcome uint8) effect {
	e := effect{kind: kind, ev: evBackoff, outcome: outcome, room: o.busy && o.roomSignal}
	o.busy = false
	if !e.room {
		e.attempt = o.backoffN
		o.backoffN++
	}
	return e
}

func endPrepare(out prepareOutcome) effect {
	return effect{kind: fxEndPrepare, ev: evPrepareIdle, outcome: uint8(out)}
}

func endScan(ev event, out scanOutcome, blockedAt common.Ts) effect {
	return effect{kind: fxEndScan, ev: ev, outcome: uint8(out), blockedAt: blockedAt}
}

func (in input) String() string {
	name := inputNames[in.kind]
	switch in.kind {
	case inPrepare, inHandshakeSent:
		if in.kind == inHandshakeSent {
			name += " " + sendResultNames[in.sent]
		}
		if in.obs.removed {
			return name + " removed"
		}
		return fmt.Sprintf("%s received=%d maxcommit=%d schema=%d lastddl=%d", name,
			in.obs.received, in.obs.maxCommit, in.obs.schemaTs, in.obs.lastDDL)
	case inScanSent:
		return name + " " + sendResultNames[in.sent]
	}
	r := in.read
	switch {
	case r.failed:
		return name + " failed"
	case r.noRoom:
		return name + " no_room"
	case r.nothing:
		return fmt.Sprintf("%s nothing received=%d schema=%d", name, r.received, r.schemaTs)
	}
	s := fmt.Sprintf("%s msgs=%d next=%d@%d", name, r.msgs, r.next.resolved, r.next.seq)
	if r.next.cursor != nil {
		s += " cursor"
	}
	if r.cut {
		s += " cut"
	}
	return s
}

func (e effect) String() string {
	name := effectNames[e.kind]
	switch e.kind {
	case fxSendHandshake:
		return fmt.Sprintf("%s start=%d", name, e.ts)
	case fxAddResolved, fxPublish:
		return fmt.Sprintf("%s %d@%d", name, e.ts, e.seq)
	case fxSendScan:
		if e.ts != 0 {
			return fmt.Sprintf("%s up-to-seq=%d resolved=%d", name, e.seq, e.ts)
		}
		return fmt.Sprintf("%s up-to-seq=%d", name, e.seq)
	}
	var out string
	if e.kind == fxEndPrepare {
		out = outcomeNames[e.outcome]
	} else {
		out = scanOutcomeNames[e.outcome]
	}
	s := fmt.Sprintf("%s %s fire=%s", name, out, e.ev)
	switch {
	case e.ev == evSchemaBlock:
		s += fmt.Sprintf(" at=%d", e.blockedAt)
	case e.ev == evBackoff && e.room:
		s += " wait=room"
	case e.ev == evBackoff:
		s += fmt.Sprintf(" attempt=%d", e.attempt)
	}
	return s
}

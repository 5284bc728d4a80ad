package eventservice

import (
	"github.com/cdcflow/eventservice/internal/touchahead"
	"github.com/cdcflow/eventservice/pkg/common"
)

// runPrepareWorker drains preparation queue i: for each session it decides
// between nothing to do, the no-scan fast path, and a real scan.
func (svc *Service) runPrepareWorker(i int) {
	q := svc.prepQueues[i]
	w := &ownerWork{}
	for {
		select {
		case <-q.doorbell:
		case <-svc.closing:
			return
		}
		for {
			popped, ok := svc.prepareBatchHolding(w, q, carryHeldAt)
			if !ok {
				return // closing while waiting for the scan channel
			}
			if popped == 0 {
				break // the queue is empty: what was held went out
			}
			select {
			case <-svc.closing:
				svc.carryHeld(&w.batch)
				return
			default:
			}
		}
	}
}

// prepareNext pops the next session of q and prepares it (one iteration of
// a preparation worker). popped is false when q was empty; ok is false only
// if the service closed while the worker waited for the scan channel.
func (svc *Service) prepareNext(w *ownerWork, q *prepareQueue) (popped, ok bool) {
	s := q.pop()
	if s == nil {
		return false, true
	}
	if act, _ := s.sched.fire(evPopPrepare); act != actOwn {
		return true, true // removed while queued
	}
	svc.knobs.reach(pointBeforePrepare, s, nil)
	return true, svc.run(w, s, input{kind: inPrepare, obs: svc.observe(s)})
}

// prepareBatchMax is how many sessions a preparation worker takes from its
// queue at once: the notifier's push shares the queue's lock and waits for
// a longer pop, so the batch is small enough to keep that wait short and
// large enough to keep most of batching's gain in resolved-ts throughput
// (BenchmarkNotifyScale at 8 and at 64: docs/benchmarks.md, "Figures behind
// the code").
const prepareBatchMax = 8

// prepBatch is a preparation worker's batch: the sessions popped, and those
// held back after their step with the effects still to carry out (held[i]
// owns fx[i]).
type prepBatch struct {
	popped [prepareBatchMax]*session
	held   []*session
	fx     [][]effect
	keys   []common.DispatcherID
	vals   []resolvedValue
}

// prepareBatch pops up to prepareBatchMax sessions of q under one lock and
// prepares each, in queue order, as prepareNext would. A preparation whose
// effects only hand progress to the resolved set (the fast path, or
// nothing: heldBack) is held back after its step; the held sessions'
// resolved-set additions then go in as one AddMany per run of one target,
// and after them each held session's publish and end are carried out, in
// order, with one clock read for the batch, not a lock and a ring per
// addition and a clock read per session. A held session stays owned
// (preparing) until its end, so nothing else prepares it in between, and
// its effects keep their order. Any other preparation (a handshake, a scan,
// a schema block) is carried out at once, after what was held so far: it
// may wait for the scan channel. popped is how many were popped; ok is
// false only if the service closed while the worker waited for the scan
// channel.
func (svc *Service) prepareBatch(w *ownerWork, q *prepareQueue) (popped int, ok bool) {
	return svc.prepareBatchHolding(w, q, 0)
}

// carryHeldAt is how many held sessions a running preparation worker
// gathers, over consecutive batches, before it carries their effects out:
// one AddMany to a target's resolved set per batch of eight was a lock and
// a handful of the set's cache lines taken from the other worker's core
// each time. The worker carries what it holds as soon as its queue is
// empty (or before anything that may wait), so holding costs a session at
// most the preparation of the others held with it.
const carryHeldAt = 256

// prepareBatchHolding is prepareBatch that keeps the held sessions (their
// effects not yet carried out) for the next call while fewer than hold
// are held and the queue was not empty; prepareBatch is hold 0.
func (svc *Service) prepareBatchHolding(w *ownerWork, q *prepareQueue, hold int) (popped int, ok bool) {
	b := &w.batch
	n := q.popMany(b.popped[:])
	ok = true
	for i, s := range b.popped[:n] {
		if i%touchahead.Chunk == 0 {
			touchForPrepare(b.popped[i:min(i+touchahead.Chunk, n)])
		}
		if act, _ := s.sched.fire(evPopPrepare); act != actOwn {
			continue // removed while queued
		}
		svc.knobs.reach(pointBeforePrepare, s, nil)
		in := input{kind: inPrepare, obs: svc.observe(s)}
		fx := s.own.step(in, w.fx[:0])
		w.fx = fx // keep what it grew to
		if k := svc.knobs.stepped; k != nil {
			k(s, in, fx)
		}
		if heldBack(fx) {
			b.held = append(b.held, s)
			b.fx = append(b.fx, append(nextFx(b.fx), fx...))
			continue
		}
		// What is held goes out first: this one may wait for the scan
		// channel, and they must not wait with it.
		svc.carryHeld(b)
		if !svc.runFrom(w, s, in, fx) {
			// Closing: the sessions popped and not prepared stay as
			// they are, which Close no longer looks at.
			ok = false
			break
		}
	}
	clear(b.popped[:n])
	if n == 0 || !ok || len(b.held) >= hold {
		svc.carryHeld(b)
	}
	return n, ok
}

// touchForPrepare reads a word of each line a preparation of ss reads
// first (the session's lines, from its scheduling word to its keepalive
// generation, and its dispatcher's frontier and identity: observe reads its
// span, the resolved set its ID), so that their cache misses overlap
// (internal/touchahead). It only reads.
func touchForPrepare(ss []*session) {
	var t uint64
	for _, s := range ss {
		s.sched.w.Load() // its first line,
		s.sent.Load()    // the owner state's,
		s.kaGen.Load()   // its last
		s.d.received.Load()
		t += s.d.id.Lo
	}
	touchahead.Keep(t)
}

// nextFx returns the spare effect slice past the end of fx (an emptied
// slice of an earlier batch), or nil.
func nextFx(fx [][]effect) []effect {
	if len(fx) < cap(fx) {
		return fx[:len(fx)+1][len(fx)][:0]
	}
	return nil
}

// heldBack reports whether a preparation's effects only hand progress to
// the resolved set: at most one fxAddResolved and one fxPublish, then an
// end that returns the session to idle.
func heldBack(fx []effect) bool {
	end := fx[len(fx)-1]
	if end.kind != fxEndPrepare || end.ev != evPrepareIdle {
		return false
	}
	for _, e := range fx[:len(fx)-1] {
		if e.kind != fxAddResolved && e.kind != fxPublish {
			return false
		}
	}
	return true
}

// carryHeld carries out the held sessions' effects: every resolved-set
// addition first (in order, one AddMany per run of sessions of one
// target), then each session's publish and end.
func (svc *Service) carryHeld(b *prepBatch) {
	if len(b.held) == 0 {
		return
	}
	var t *target
	flush := func() {
		if len(b.keys) > 0 {
			t.resolved.AddMany(b.keys, b.vals)
		}
		clear(b.vals) // drop the session pointers
		b.keys, b.vals = b.keys[:0], b.vals[:0]
	}
	// The outcomes are counted before any addition: once the pump can
	// deliver a held session's progress, its preparation shows in the
	// metric (a reader that saw the progress arrive, as a test does, reads
	// a count that includes it).
	var outcomes [numOutcomes]int
	for i := range b.held {
		for _, e := range b.fx[i] {
			if e.kind == fxEndPrepare {
				outcomes[e.outcome]++
			}
		}
	}
	for o, n := range outcomes {
		if n > 0 {
			svc.metrics.prepareOutcomes[o].Add(float64(n))
		}
	}
	for i, s := range b.held {
		for _, e := range b.fx[i] {
			if e.kind != fxAddResolved {
				continue
			}
			if s.d.target != t {
				flush()
				t = s.d.target
			}
			s.sent.Store(uint64(e.ts)) // before the pump can deliver it
			s.inSet.Store(true)
			b.keys = append(b.keys, s.d.id)
			b.vals = append(b.vals, resolvedValue{s: s, epoch: s.epoch, seq: e.seq, ts: e.ts})
		}
	}
	flush()
	now := svc.opts.Clock.Now()
	for i, s := range b.held {
		for _, e := range b.fx[i] {
			switch e.kind {
			case fxPublish:
				s.publish(e.ts, e.seq, now)
			case fxEndPrepare:
				svc.endPrepare(s, e)
			}
		}
		b.fx[i] = b.fx[i][:0]
	}
	clear(b.held)
	b.held, b.fx = b.held[:0], b.fx[:0]
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

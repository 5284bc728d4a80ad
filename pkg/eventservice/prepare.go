package eventservice

import (
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
			popped, ok := svc.prepareNext(w, q)
			if !ok {
				return // closing while waiting for the scan channel
			}
			if !popped {
				break
			}
			select {
			case <-svc.closing:
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

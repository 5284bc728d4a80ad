package eventservice

import (
	"fmt"
	"sync/atomic"
)

// scanState is where one session (a dispatcher in one epoch) stands in the
// scan pipeline. Only the transition function below changes it.
type scanState uint8

const (
	// stateIdle: nothing queued, nothing running; a request queues it.
	stateIdle scanState = iota
	// statePrepareQueued: in its preparation worker's queue exactly once.
	statePrepareQueued
	// statePreparing: a preparation worker owns it.
	statePreparing
	// stateScanQueued: handed to (or waiting to enter) the scan channel.
	stateScanQueued
	// stateScanning: a scan worker owns it.
	stateScanning
	// stateSchemaBlocked: parked until the schema frontier passes the
	// ts it waits for.
	stateSchemaBlocked
	// stateBackingOff: its target refused a send; parked until its back-off
	// delay expires. (An addition to the seed's machine: without it a
	// notification would re-queue a dispatcher whose target is busy at
	// once, hammering the congested target.)
	stateBackingOff
	// stateRemoved: the session was removed or superseded by a reset;
	// terminal.
	stateRemoved
	numStates
)

var stateNames = [numStates]string{"idle", "prepare_queued", "preparing", "scan_queued", "scanning", "schema_blocked", "backing_off", "removed"}

func (s scanState) String() string {
	if s < numStates {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// event is an input to the state machine.
type event uint8

const (
	// evRequest: a notification or an internal request for preparation.
	evRequest event = iota
	// evPopPrepare: a preparation worker popped the session.
	evPopPrepare
	// evPrepareIdle: preparation found nothing to read (or took the no-scan
	// fast path).
	evPrepareIdle
	// evPrepareScan: preparation decided a real scan is needed.
	evPrepareScan
	// evPopScan: a scan worker took the session from the scan channel.
	evPopScan
	// evScanDone: the scan reached the end of its range.
	evScanDone
	// evScanInterrupted: the scan stopped at a size limit; more to read.
	evScanInterrupted
	// evSchemaBlock: the schema frontier is what stops the owner.
	evSchemaBlock
	// evBackoff: the target refused or failed a send.
	evBackoff
	// evSchemaAdvanced: the schema frontier passed the blocking ts.
	evSchemaAdvanced
	// evBackoffExpired: the back-off delay elapsed.
	evBackoffExpired
	// evRemove: remove, or reset to a newer epoch.
	evRemove
	numEvents
)

var eventNames = [numEvents]string{"request", "pop_prepare", "prepare_idle", "prepare_scan", "pop_scan", "scan_done",
	"scan_interrupted", "schema_block", "backoff", "schema_advanced", "backoff_expired", "remove"}

func (e event) String() string {
	if e < numEvents {
		return eventNames[e]
	}
	return fmt.Sprintf("event(%d)", uint8(e))
}

// action is what the caller of a transition must do next.
type action uint8

const (
	// actNone: nothing (includes "absorbed": coalesced into queued work).
	actNone action = iota
	// actPending: recorded as the one pending follow-up of the owner.
	actPending
	// actEnqueuePrepare: push the session onto its preparation queue.
	actEnqueuePrepare
	// actOwn: the caller now owns the session (pop succeeded).
	actOwn
	// actSendScan: put the session on the scan channel.
	actSendScan
	// actPark: register the session with the schema-blocked set.
	actPark
	// actArmBackoff: schedule evBackoffExpired.
	actArmBackoff
	// actStale: the event does not apply (a stale queue entry, a late
	// timer); the caller drops it.
	actStale
	// actDiscard: the session was removed while owned; the owner drops its
	// results and releases it.
	actDiscard
	// actRemoved: the session just became removed; the caller unlinks it
	// from wherever it is queued.
	actRemoved
)

var actionNames = [...]string{"none", "pending", "enqueue_prepare", "own", "send_scan", "park", "arm_backoff", "stale", "discard", "removed"}

func (a action) String() string {
	if int(a) < len(actionNames) {
		return actionNames[a]
	}
	return fmt.Sprintf("action(%d)", uint8(a))
}

// schedWord packs a scanState and the pending flag into one word so that a
// transition is a single compare-and-swap: the notify path never takes a
// lock.
type schedWord uint32

const pendingBit schedWord = 1 << 8

func pack(s scanState, pending bool) schedWord {
	w := schedWord(s)
	if pending {
		w |= pendingBit
	}
	return w
}

func (w schedWord) state() scanState { return scanState(w & 0xff) }
func (w schedWord) pending() bool    { return w&pendingBit != 0 }

// transition is the whole state machine: a pure function from (state,
// pending, event) to (state, pending, action). Every cell of the
// state x event table is covered by TestTransitionTable.
//
// Coalescing rules (the seed's): a request while queued (prepare or scan)
// is absorbed, because the queued work reads the latest frontier when it
// runs; a request while owned (preparing or scanning) records one pending
// follow-up, however many arrive.
func transition(s scanState, pending bool, e event) (scanState, bool, action) {
	if s == stateRemoved {
		switch e {
		case evPrepareIdle, evPrepareScan, evScanDone, evScanInterrupted, evSchemaBlock, evBackoff:
			return stateRemoved, false, actDiscard
		default:
			return stateRemoved, false, actStale
		}
	}
	if e == evRemove {
		return stateRemoved, false, actRemoved
	}
	switch e {
	case evRequest:
		switch s {
		case stateIdle:
			return statePrepareQueued, false, actEnqueuePrepare
		case statePreparing, stateScanning:
			return s, true, actPending
		default: // queued or parked: absorbed
			return s, pending, actNone
		}
	case evPopPrepare:
		if s == statePrepareQueued {
			return statePreparing, false, actOwn
		}
	case evPrepareIdle:
		if s == statePreparing {
			if pending {
				return statePrepareQueued, false, actEnqueuePrepare
			}
			return stateIdle, false, actNone
		}
	case evPrepareScan:
		if s == statePreparing {
			// The scan reads the frontier when it starts, after every
			// request that set pending: the follow-up is absorbed.
			return stateScanQueued, false, actSendScan
		}
	case evPopScan:
		if s == stateScanQueued {
			return stateScanning, false, actOwn
		}
	case evScanDone:
		if s == stateScanning {
			if pending {
				return statePrepareQueued, false, actEnqueuePrepare
			}
			return stateIdle, false, actNone
		}
	case evScanInterrupted:
		if s == stateScanning {
			return statePrepareQueued, false, actEnqueuePrepare
		}
	case evSchemaBlock:
		if s == statePreparing || s == stateScanning {
			// New data cannot be read past the schema frontier, so a
			// pending follow-up is subsumed by the wait for the frontier.
			return stateSchemaBlocked, false, actPark
		}
	case evBackoff:
		if s == statePreparing || s == stateScanning {
			// The expiry re-queues it and reads the latest frontier, which
			// subsumes any pending follow-up.
			return stateBackingOff, false, actArmBackoff
		}
	case evSchemaAdvanced:
		if s == stateSchemaBlocked {
			return statePrepareQueued, false, actEnqueuePrepare
		}
	case evBackoffExpired:
		if s == stateBackingOff {
			return statePrepareQueued, false, actEnqueuePrepare
		}
	}
	return s, pending, actStale
}

// sched is a session's scheduling word.
type sched struct{ w atomic.Uint32 }

// fire applies e atomically and returns the action and the state reached.
func (s *sched) fire(e event) (action, scanState) {
	for {
		old := schedWord(s.w.Load())
		ns, np, act := transition(old.state(), old.pending(), e)
		nw := pack(ns, np)
		if nw == old || s.w.CompareAndSwap(uint32(old), uint32(nw)) {
			return act, ns
		}
	}
}

// load returns the current state and pending flag.
func (s *sched) load() (scanState, bool) {
	w := schedWord(s.w.Load())
	return w.state(), w.pending()
}

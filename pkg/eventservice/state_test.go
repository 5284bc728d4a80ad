package eventservice

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTransitionTable checks every state x pending x event against a table
// written out by hand. A cell not listed must be "stale, unchanged".
func TestTransitionTable(t *testing.T) {
	type key struct {
		s scanState
		p bool
		e event
	}
	type want struct {
		s scanState
		p bool
		a action
	}
	table := map[key]want{}
	for _, p := range []bool{false, true} {
		// Requests: queue from idle, absorb while queued or parked, one
		// pending follow-up while owned.
		table[key{stateIdle, p, evRequest}] = want{statePrepareQueued, false, actEnqueuePrepare}
		table[key{statePrepareQueued, p, evRequest}] = want{statePrepareQueued, p, actNone}
		table[key{statePreparing, p, evRequest}] = want{statePreparing, true, actPending}
		table[key{stateScanQueued, p, evRequest}] = want{stateScanQueued, p, actNone}
		table[key{stateScanning, p, evRequest}] = want{stateScanning, true, actPending}
		table[key{stateSchemaBlocked, p, evRequest}] = want{stateSchemaBlocked, p, actNone}
		table[key{stateBackingOff, p, evRequest}] = want{stateBackingOff, p, actNone}

		table[key{statePrepareQueued, p, evPopPrepare}] = want{statePreparing, false, actOwn}
		table[key{statePreparing, p, evPrepareScan}] = want{stateScanQueued, false, actSendScan}
		table[key{stateScanQueued, p, evPopScan}] = want{stateScanning, false, actOwn}
		table[key{stateScanning, p, evScanInterrupted}] = want{statePrepareQueued, false, actEnqueuePrepare}
		for _, owned := range []scanState{statePreparing, stateScanning} {
			table[key{owned, p, evSchemaBlock}] = want{stateSchemaBlocked, false, actPark}
			table[key{owned, p, evBackoff}] = want{stateBackingOff, false, actArmBackoff}
		}
		table[key{stateSchemaBlocked, p, evSchemaAdvanced}] = want{statePrepareQueued, false, actEnqueuePrepare}
		table[key{stateBackingOff, p, evBackoffExpired}] = want{statePrepareQueued, false, actEnqueuePrepare}
		for s := range numStates {
			if s != stateRemoved {
				table[key{s, p, evRemove}] = want{stateRemoved, false, actRemoved}
			}
		}
		// Removed is terminal: owners discard, everything else is stale.
		for e := range numEvents {
			a := actStale
			switch e {
			case evPrepareIdle, evPrepareScan, evScanDone, evScanInterrupted, evSchemaBlock, evBackoff:
				a = actDiscard
			}
			table[key{stateRemoved, p, e}] = want{stateRemoved, false, a}
		}
	}
	// Completion: back to idle, or re-queued once if a follow-up is pending.
	table[key{statePreparing, false, evPrepareIdle}] = want{stateIdle, false, actNone}
	table[key{statePreparing, true, evPrepareIdle}] = want{statePrepareQueued, false, actEnqueuePrepare}
	table[key{stateScanning, false, evScanDone}] = want{stateIdle, false, actNone}
	table[key{stateScanning, true, evScanDone}] = want{statePrepareQueued, false, actEnqueuePrepare}

	var cells int
	for s := range numStates {
		for _, p := range []bool{false, true} {
			for e := range numEvents {
				cells++
				w, ok := table[key{s, p, e}]
				if !ok {
					w = want{s, p, actStale}
				}
				gs, gp, ga := transition(s, p, e)
				require.Equal(t, w, want{gs, gp, ga}, "state %v pending %v event %v", s, p, e)
			}
		}
	}
	require.Equal(t, int(numStates)*2*int(numEvents), cells)
}

// TestRequestsCoalesceToOneFollowUp: however many requests arrive while a
// session is owned, completion re-queues it exactly once.
func TestRequestsCoalesceToOneFollowUp(t *testing.T) {
	var s sched
	act, _ := s.fire(evRequest)
	require.Equal(t, actEnqueuePrepare, act)
	for range 100 {
		act, _ = s.fire(evRequest)
		require.Equal(t, actNone, act, "absorbed while queued")
	}
	act, _ = s.fire(evPopPrepare)
	require.Equal(t, actOwn, act)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 1000 {
				s.fire(evRequest)
			}
		})
	}
	wg.Wait()
	st, pending := s.load()
	require.Equal(t, statePreparing, st)
	require.True(t, pending)
	act, st = s.fire(evPrepareIdle)
	require.Equal(t, actEnqueuePrepare, act)
	require.Equal(t, statePrepareQueued, st)
	_, pending = s.load()
	require.False(t, pending, "exactly one follow-up")
}

func TestStringers(t *testing.T) {
	for s := range numStates + 1 {
		require.NotEmpty(t, s.String())
	}
	for e := range numEvents + 1 {
		require.NotEmpty(t, e.String())
	}
	require.True(t, strings.HasPrefix(action(99).String(), "action("))
	require.Equal(t, "removed", fmt.Sprint(stateRemoved))
}

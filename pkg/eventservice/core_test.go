package eventservice

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
)

// TestOwnerStepIsWellFormed walks the owner's step over every input kind,
// every send result and a grid of owner states and observations, and checks
// what the workers rely on: each step's effects end in exactly one send or
// end effect, never anything after it; a send is answered by the input it
// expects; every end fires an event the scheduling word accepts from the
// state the owner holds (transition gives no stale action), so the two
// halves of the core agree; progress never moves back, and a failed or
// refused send leaves it untouched.
func TestOwnerStepIsWellFormed(t *testing.T) {
	observations := []observation{
		{removed: true},
		{received: 0, schemaTs: 100},
		{received: 50, schemaTs: 100},
		{received: 50, maxCommit: 30, schemaTs: 100},
		{received: 50, schemaTs: 30},
		{received: 50, schemaTs: 20},
		{received: 50, schemaTs: 100, lastDDL: 40},
	}
	reads := []scanRead{
		{failed: true},
		{noRoom: true},
		{nothing: true, received: 20, schemaTs: 100},
		{nothing: true, received: 50, schemaTs: 20},
		{msgs: 0, next: progress{resolved: 50, seq: 1}, received: 50, schemaTs: 100},
		{msgs: 0, next: progress{resolved: 20, seq: 1}, received: 50, schemaTs: 20},
		{msgs: 2, next: progress{resolved: 50, seq: 3}, received: 50, schemaTs: 100},
		{msgs: 2, next: progress{resolved: 30, seq: 3}, cut: true, received: 50, schemaTs: 100},
		{msgs: 1, next: progress{resolved: 29, seq: 2, cursor: &eventstore.Cursor{CommitTs: 30, StartTs: 28}}, cut: true, received: 50, schemaTs: 100},
	}
	results := []sendResult{sentOK, sentRetired, sentBusy, sentFailed}
	var owners []owner
	for _, seq := range []uint64{0, 1} {
		for _, busy := range []bool{false, true} {
			for _, room := range []bool{false, true} {
				for _, cursor := range []bool{false, true} {
					o := owner{progress: progress{resolved: 20, seq: seq}, busy: busy, roomSignal: room, startTs: 20, backoffN: 2}
					if cursor {
						o.progress.cursor = &eventstore.Cursor{CommitTs: 21, StartTs: 19}
					}
					owners = append(owners, o)
				}
			}
		}
	}
	// drive steps o from in through every answer to its sends, checking
	// each step; state is the scheduling state the owner holds.
	var drive func(name string, o owner, in input, state scanState, depth int)
	drive = func(name string, o owner, in input, state scanState, depth int) {
		require.Less(t, depth, 4, "%s: a step chain that does not end", name)
		before := o.progress
		fx := o.step(in, nil)
		require.NotEmpty(t, fx, name)
		for i, e := range fx[:len(fx)-1] {
			require.Contains(t, []effectKind{fxAddResolved, fxPublish}, e.kind, "%s: effect %d (%s) before the last", name, i, e)
		}
		require.GreaterOrEqual(t, o.progress.resolved, before.resolved, "%s: progress moved back", name)
		require.GreaterOrEqual(t, o.progress.seq, before.seq, "%s: seq moved back", name)
		last := fx[len(fx)-1]
		switch last.kind {
		case fxSendHandshake:
			require.Equal(t, inPrepare, in.kind, name)
			for _, r := range results {
				for _, obs := range observations[1:] {
					drive(fmt.Sprintf("%s/handshake_%s/%+v", name, sendResultNames[r], obs), o, input{kind: inHandshakeSent, sent: r, obs: obs}, state, depth+1)
				}
			}
		case fxSendScan:
			require.Equal(t, inScanRead, in.kind, name)
			for _, r := range results {
				sent := input{kind: inScanSent, sent: r, read: in.read}
				if next := o; r != sentOK {
					next.step(sent, nil)
					require.Equal(t, before, next.progress, "%s: a %s send changed progress", name, sendResultNames[r])
				}
				drive(fmt.Sprintf("%s/scan_%s", name, sendResultNames[r]), o, sent, state, depth+1)
			}
		case fxEndPrepare, fxEndScan:
			wantKind := fxEndPrepare
			if state == stateScanning {
				wantKind = fxEndScan
			}
			require.Equal(t, wantKind, last.kind, "%s: %s ends from %s", name, last, state)
			_, _, act := transition(state, false, last.ev)
			require.NotEqual(t, actStale, act, "%s: %s is stale in %s", name, last.ev, state)
			if last.ev == evSchemaBlock {
				require.NotZero(t, last.blockedAt, "%s: a schema block without its ts", name)
			}
		default:
			t.Fatalf("%s: the last effect %s is neither a send nor an end", name, last)
		}
	}
	for i, o := range owners {
		for _, obs := range observations {
			drive(fmt.Sprintf("owner%d/prepare/%+v", i, obs), o, input{kind: inPrepare, obs: obs}, statePreparing, 0)
		}
		if o.progress.seq == 0 {
			continue // a scan follows a handshake
		}
		for j, r := range reads {
			if r.next.resolved != 0 && r.next.resolved < o.progress.resolved {
				continue // a scan reads above its progress
			}
			drive(fmt.Sprintf("owner%d/scan%d", i, j), o, input{kind: inScanRead, read: r}, stateScanning, 0)
		}
	}
}

// TestOwnerBackoffCountsAttempts: a timed back-off uses attempt n and
// counts it; a busy refusal with a room signal waits for room and leaves
// the count; an accepted send resets it.
func TestOwnerBackoffCountsAttempts(t *testing.T) {
	o := owner{progress: progress{resolved: 10, seq: 1}}
	read := input{kind: inScanRead, read: scanRead{msgs: 1, next: progress{resolved: 20, seq: 2}, received: 20, schemaTs: 100}}
	for n := range 3 {
		o.step(read, nil)
		fx := o.step(input{kind: inScanSent, sent: sentFailed}, nil)
		require.Equal(t, n, fx[len(fx)-1].attempt)
		require.False(t, fx[len(fx)-1].room)
	}
	o.roomSignal = true
	o.step(read, nil)
	fx := o.step(input{kind: inScanSent, sent: sentBusy}, nil)
	require.True(t, fx[len(fx)-1].room)
	require.Equal(t, 3, o.backoffN, "waiting for room is not a timed attempt")
	fx = o.step(input{kind: inScanRead, read: scanRead{noRoom: true}}, nil)
	require.Len(t, fx, 1, "a scan with no room sends nothing")
	require.Equal(t, evBackoff, fx[0].ev)
	require.True(t, fx[0].room, "no room before the read waits for room, as a busy refusal does")
	require.Equal(t, 3, o.backoffN)
	require.False(t, o.busy, "the wait is chosen; nothing carries over")
	o.roomSignal = false
	fx = o.step(input{kind: inScanRead, read: scanRead{noRoom: true}}, nil)
	require.Equal(t, 3, fx[0].attempt, "without a room signal it is a timed attempt")
	require.Equal(t, 4, o.backoffN)
	o.step(read, nil)
	o.step(input{kind: inScanSent, sent: sentOK, read: read.read}, nil)
	require.Zero(t, o.backoffN)
	require.Equal(t, common.Ts(20), o.progress.resolved)
}

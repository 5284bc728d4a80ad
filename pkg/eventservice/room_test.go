package eventservice

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// TestABusyTargetWakesItsSendersWhenItHasRoom: with an inbox far smaller
// than the data, sends are refused as busy (or scans put off before their
// read, TestAScanWaitsForRoomBeforeReading); the refused sessions and the
// resolved-ts pump wait for the inbox to have room (the transport's room
// signal), not for a back-off timer: the clock here is fake and never
// moves, so a timed back-off would never end, yet every row arrives as the
// receiver drains.
func TestABusyTargetWakesItsSendersWhenItHasRoom(t *testing.T) {
	small, err := messaging.NewInProcess(messaging.InProcessOptions{Capacity: 8})
	require.NoError(t, err)
	defer small.Close()
	inbox, err := small.Register(testTarget)
	require.NoError(t, err)
	fc := clock.NewFake(time.Unix(1_000_000, 0))
	h := newHarness(t, func(o *Options) {
		o.Transport, o.Clock = small, fc
		o.BatchRows, o.MaxMessagesPerTask, o.ResolvedBatch = 1, 4, 2
	}, hooks{})
	h.check = newStreamChecker(t, inbox)
	h.advanceSchema(1 << 40)
	const n = 6
	ids := make([]common.DispatcherID, n)
	for i := range ids {
		ids[i] = h.register(uint64(i+1), 10) // 6 handshakes: the inbox is nearly full
	}
	for i := range ids {
		var rows []common.Row
		for k := range 10 {
			rows = append(rows, row(fmt.Sprintf("k%d", k), common.Ts(11+2*k), common.Ts(12+2*k)))
		}
		h.push(uint64(i+1), 40, rows...)
	}
	for _, id := range ids {
		es := h.check.waitResolved(id, 40) // drains the inbox as it waits
		require.Len(t, es.rows, 10)
	}
	// Senders did wait for room: refused as busy, or (a scan) put off
	// before its read because the inbox was past half.
	waited := testutilCounter(h.svc.metrics.sendRefusals.WithLabelValues("busy")) + testutilCounter(h.svc.metrics.deferredScans)
	require.Positive(t, waited, "the inbox did hold senders back")
	require.Zero(t, h.svc.backoff.len(), "no refused sender waited on a timer")
}

// TestAScanWaitsForRoomBeforeReading: a scan whose target has no room (at
// least half its inbox in use) reads nothing and waits for room, as a
// refused send does, instead of reading rows that the send would refuse
// and throw away; once the receiver drains, the rows are read once and
// delivered. The inbox here holds 8 and five handshakes fill it past half,
// so the scan's two messages would still fit: without the check before the
// read the rows would go at once, and no scan would be deferred.
func TestAScanWaitsForRoomBeforeReading(t *testing.T) {
	small, err := messaging.NewInProcess(messaging.InProcessOptions{Capacity: 8})
	require.NoError(t, err)
	defer small.Close()
	inbox, err := small.Register(testTarget)
	require.NoError(t, err)
	prepared := make(chan prepareOutcome, 16)
	scanned := make(chan scanOutcome, 16)
	// The handshakes wait until every dispatcher is registered: the
	// checker drains the inbox at each registration.
	registered := make(chan struct{})
	h := newHarness(t, func(o *Options) {
		o.Transport, o.Clock = small, clock.NewFake(time.Unix(1_000_000, 0))
		o.BatchRows = 16
	}, hooks{
		beforePrepare: func(*session) { <-registered },
		prepared:      func(_ *session, out prepareOutcome) { prepared <- out },
		scanned:       func(_ *session, out scanOutcome) { scanned <- out },
	})
	release := sync.OnceFunc(func() { close(registered) })
	t.Cleanup(release) // before the harness's: a failed registration must not hang Close
	h.check = newStreamChecker(t, inbox)
	h.advanceSchema(1 << 40)
	const n = 5
	for i := range n {
		h.register(uint64(i+1), 10)
	}
	release()
	for range n {
		require.Equal(t, outcomeNothing, <-prepared, "a handshake, nothing else")
	}
	require.False(t, small.HasRoom(testTarget), "five handshakes in an inbox of 8")

	var rows []common.Row
	for k := range 10 {
		rows = append(rows, row(fmt.Sprintf("k%d", k), common.Ts(11+2*k), common.Ts(12+2*k)))
	}
	h.push(1, 40, rows...)
	require.Equal(t, outcomeScan, <-prepared)
	require.Equal(t, scanNoRoom, <-scanned, "the scan waits for room")
	require.Zero(t, testutilCounter(h.svc.metrics.scannedRows), "and read nothing")
	require.Equal(t, 1.0, testutilCounter(h.svc.metrics.deferredScans))

	es := h.check.waitResolved(common.DispatcherIDFromUint64(1), 40) // drains: room again
	require.Len(t, es.rows, 10)
	require.Equal(t, 10.0, testutilCounter(h.svc.metrics.scannedRows), "each row read once")
	require.Zero(t, testutilCounter(h.svc.metrics.sendRefusals.WithLabelValues("busy")), "no send was refused")
}

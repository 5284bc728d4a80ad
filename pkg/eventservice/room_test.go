package eventservice

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// TestABusyTargetWakesItsSendersWhenItHasRoom: with an inbox far smaller
// than the data, sends are refused as busy; the refused sessions and the
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
	require.Positive(t, testutilCounter(h.svc.metrics.sendRefusals.WithLabelValues("busy")), "the inbox did refuse")
	require.Zero(t, h.svc.backoff.len(), "no refused sender waited on a timer")
}

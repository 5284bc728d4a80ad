package eventservice

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
)

// A collector may heartbeat only what it was sent: the service raises a
// session's sent mark before a scan's send (the receiver may heartbeat
// before Send returns) and lowers it again when the send fails. A
// collector that heartbeats the refused scan's resolved-ts (it never got
// it; a lying or confused peer) is capped at what was sent before, so the
// store's checkpoint, which lets GC delete rows, never passes rows that
// were not delivered.
func TestAHeartbeatOfARefusedScansResolvedTsIsCappedAtWhatWasSent(t *testing.T) {
	failed := make(chan scanOutcome, 8)
	h := newHarness(t, func(o *Options) {
		// No retry of the refused scan while the test looks: a retry
		// raises the mark again before its own send.
		o.BackoffBase, o.BackoffMax = time.Hour, time.Hour
	}, hooks{scanned: func(_ *session, out scanOutcome) {
		if out != scanDone {
			failed <- out
		}
	}})
	h.advanceSchema(1 << 40)
	id := h.register(1, 10)
	h.push(1, 40, row("a", 15, 20))
	h.check.waitResolved(id, 40)

	h.tr.refuse.Store(true)
	h.push(1, 80, row("b", 55, 60))
	select {
	case out := <-failed:
		require.Equal(t, scanOutcomeNames[scanFailed], scanOutcomeNames[out])
	case <-time.After(30 * time.Second):
		t.Fatal("the refused scan never ended")
	}
	require.NoError(t, h.heartbeat(id, 1, 80), "a heartbeat of the refused scan's resolved-ts")
	snap, err := h.svc.Inspect(id)
	require.NoError(t, err)
	require.Equal(t, common.Ts(40), snap.Checkpoint, "capped at what was sent, not the refused 80")
	st, err := h.store.Dispatcher(id)
	require.NoError(t, err)
	require.LessOrEqual(t, st.Checkpoint, common.Ts(40), "the store's checkpoint never passes the undelivered row at 60")
}

package eventcollector

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// TestAHeartbeatEntryTheServiceDoubleRefusesIsReportedAgain: heartbeats
// carry only what changed, so an entry the service refuses with a code
// other than OK or stale-epoch (here internal, unavailable) must be listed
// again and reported at the next tick though its checkpoint did not move,
// while the entries of the same call that were accepted are not. The
// service is the recording double (the edge this test is about); it
// answers the first entry of the first heartbeat with the refusal.
//
// Interleaving: two dispatchers advance; tick 1 sends both in one call,
// the double refuses the first and accepts the second; tick 2 (nothing
// advanced in between) must carry exactly the refused entry, which the
// double now accepts; tick 3 carries nothing.
func TestAHeartbeatEntryTheServiceDoubleRefusesIsReportedAgain(t *testing.T) {
	for _, refusal := range []error{messaging.ErrInternal, messaging.ErrUnavailable} {
		t.Run(messaging.CodeOf(refusal).String(), func(t *testing.T) {
			h := newCrafted(t, nil, nil)
			a := h.addAndHandshake(1, 10)
			b := h.addAndHandshake(2, 10)
			h.deliver(resolved(a, 1, 1, 20), resolved(b, 1, 1, 30))
			h.svc.mu.Lock()
			h.svc.heartbeatErrs = []error{fmt.Errorf("%w: the test's service refuses the entry", refusal)}
			h.svc.mu.Unlock()

			h.tick() // one call: the first entry refused, the second accepted
			refused, accepted := <-h.svc.heartbeatCh, <-h.svc.heartbeatCh
			require.ElementsMatch(t, []common.DispatcherID{a, b}, []common.DispatcherID{refused.id, accepted.id})
			require.Equal(t, common.Ts(10), h.status(refused.id).LastHeartbeat, "refused: not acknowledged")
			require.Equal(t, accepted.checkpoint, h.status(accepted.id).LastHeartbeat, "accepted")

			h.tick() // nothing advanced: the refused entry goes again, alone
			select {
			case again := <-h.svc.heartbeatCh:
				require.Equal(t, refused, again, "the refused entry is reported again at the next tick")
			default:
				t.Fatalf("the entry refused with %v was not reported again at the next tick", messaging.CodeOf(refusal))
			}
			require.Empty(t, h.svc.heartbeatCh, "the accepted entry is not reported again")
			require.Equal(t, refused.checkpoint, h.status(refused.id).LastHeartbeat, "accepted on the retry")

			h.tick() // all accepted: nothing is listed
			require.Empty(t, h.svc.heartbeatCh)
			h.svc.mu.Lock()
			defer h.svc.mu.Unlock()
			require.Equal(t, 2, h.svc.heartbeatReqs, "the first call, the retry, and no third")
		})
	}
}

package eventservice

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// A collector that restarted (or lost its connection) does not know the
// registrations the service holds for its dispatchers. A Register with
// Replace takes the dispatcher over: the old registration is removed (its
// requests are stale from then on) and the new one is delivered from its
// start-ts. Without Replace the same request is ErrDispatcherExists.
func TestRegisterWithReplaceTakesTheDispatcherOver(t *testing.T) {
	h := newHarness(t, nil, hooks{})
	ctx := context.Background()
	h.advanceSchema(100)
	id := h.register(1, 1)
	old := h.regOf(id)
	h.push(1, 10, row("a", 4, 5))
	h.check.waitResolved(id, 10)

	req := messaging.RegisterRequest{Dispatcher: id, Registration: old + 100, Span: common.TableSpan(1), StartTs: 5, Target: testTarget}
	require.ErrorIs(t, h.svc.Register(ctx, req), messaging.ErrDispatcherExists, "no takeover without Replace")

	req.Replace = true
	undo := h.check.expect(id, req.Registration)
	if err := h.svc.Register(ctx, req); err != nil {
		undo()
		require.NoError(t, err)
	}
	h.regs[id] = req.Registration
	snap, err := h.svc.Inspect(id)
	require.NoError(t, err)
	require.Equal(t, req.Registration, snap.Registration, "the new registration holds the dispatcher")
	require.ErrorIs(t, h.svc.Remove(ctx, messaging.RemoveRequest{Dispatcher: id, Registration: old}), messaging.ErrStaleRegistration,
		"the old registration is gone")

	// The new registration starts at 5: the row at 5 is not sent again,
	// the one after is.
	h.push(1, 20, row("b", 14, 15))
	st := h.check.waitResolved(id, 20)
	require.Len(t, st.rows, 1)
	require.Equal(t, common.Ts(15), st.rows[0].CommitTs)
	require.NoError(t, h.svc.Register(ctx, req), "a repeated takeover of the same registration is a repeated request")
}

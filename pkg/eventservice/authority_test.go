package eventservice

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// authorityForTest may serve the targets it lists (the edge under test:
// what a transport derives from a peer's certificate).
type authorityForTest struct {
	id      string
	targets []messaging.Target
}

func (a authorityForTest) Identity() string { return a.id }
func (a authorityForTest) MayServe(t messaging.Target) bool {
	for _, x := range a.targets {
		if x == t {
			return true
		}
	}
	return false
}

// A caller acts only for the targets its authority names: it may not
// register under another target, take another target's dispatcher over,
// or reset, remove or heartbeat another target's registration. The owner
// is unaffected and keeps receiving.
func TestControlRequestsActOnlyForTheCallersTargets(t *testing.T) {
	h, id, reg := deliveringOneDispatcher(t)

	owner := messaging.WithAuthority(context.Background(), authorityForTest{id: "collector-1", targets: []messaging.Target{testTarget}})
	intruder := messaging.WithAuthority(context.Background(), authorityForTest{id: "collector-2", targets: []messaging.Target{"collector-2"}})

	steal := messaging.RegisterRequest{Dispatcher: id, Registration: reg + 100, Span: common.TableSpan(1), StartTs: 1, Target: testTarget, Replace: true}
	require.ErrorIs(t, h.svc.Register(intruder, steal), messaging.ErrPermissionDenied, "registering under another's target")
	steal.Target = "collector-2"
	require.ErrorIs(t, h.svc.Register(intruder, steal), messaging.ErrPermissionDenied, "taking another target's dispatcher over")
	fresh := messaging.RegisterRequest{Dispatcher: common.DispatcherIDFromUint64(9), Registration: 900, Span: common.TableSpan(9), StartTs: 1, Target: testTarget}
	require.ErrorIs(t, h.svc.Register(intruder, fresh), messaging.ErrPermissionDenied, "a new dispatcher under another's target")
	require.ErrorIs(t, h.svc.Reset(intruder, messaging.ResetRequest{Dispatcher: id, Registration: reg, Epoch: 2, StartTs: 1}), messaging.ErrPermissionDenied)
	require.ErrorIs(t, h.svc.Remove(intruder, messaging.RemoveRequest{Dispatcher: id, Registration: reg}), messaging.ErrPermissionDenied)
	reply, err := h.svc.Heartbeat(intruder, messaging.HeartbeatRequest{Checkpoints: []messaging.DispatcherCheckpoint{{Dispatcher: id, Registration: reg, Epoch: 1, Ts: 10}}})
	require.NoError(t, err)
	require.Equal(t, []messaging.Code{messaging.CodePermissionDenied}, reply.Codes)
	require.Equal(t, 6.0, testutilCounter(h.svc.metrics.refusedControl.WithLabelValues(refusedPermission)), "one per refusal")

	snap, err := h.svc.Inspect(id)
	require.NoError(t, err)
	require.Equal(t, reg, snap.Registration, "the owner still holds the dispatcher")
	require.Equal(t, common.Ts(1), snap.Checkpoint, "the intruder's checkpoint was not recorded")
	h.push(1, 20, row("b", 14, 15))
	st := h.check.waitResolved(id, 20)
	require.Len(t, st.rows, 2, "the owner keeps receiving")

	// The owner may do all of it.
	reply, err = h.svc.Heartbeat(owner, messaging.HeartbeatRequest{Checkpoints: []messaging.DispatcherCheckpoint{{Dispatcher: id, Registration: reg, Epoch: 1, Ts: 10}}})
	require.NoError(t, err)
	require.Equal(t, []messaging.Code{messaging.CodeOK}, reply.Codes)
	require.NoError(t, h.svc.Remove(owner, messaging.RemoveRequest{Dispatcher: id, Registration: reg}))
}

// MaxTargets and MaxDispatchersPerTarget bound what registrations can make
// the service hold; a refusal changes nothing and is counted.
func TestRegistrationsBeyondTheServiceBoundsAreRefused(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.MaxTargets = 2; o.MaxDispatchersPerTarget = 2 }, hooks{})
	h.advanceSchema(100)
	h.register(1, 1)
	h.register(2, 1)
	err := h.registerOn(common.DispatcherIDFromUint64(3), 3, 1, testTarget)
	require.ErrorIs(t, err, messaging.ErrLimitExceeded)
	require.Equal(t, messaging.CodeLimitExceeded, messaging.CodeOf(err))
	require.NoError(t, h.registerOn(common.DispatcherIDFromUint64(4), 4, 1, "collector-2"), "another target, within MaxTargets")
	require.ErrorIs(t, h.registerOn(common.DispatcherIDFromUint64(5), 5, 1, "collector-3"), messaging.ErrLimitExceeded, "a third target")
	require.Equal(t, 2, h.svc.targetCount())
	require.Equal(t, 1.0, testutilCounter(h.svc.metrics.refusedControl.WithLabelValues(refusedMaxTargets)))
	require.Equal(t, 1.0, testutilCounter(h.svc.metrics.refusedControl.WithLabelValues(refusedMaxDispatchers)))
	_, err = h.svc.Inspect(common.DispatcherIDFromUint64(3))
	require.ErrorIs(t, err, messaging.ErrUnknownDispatcher, "a refused registration leaves nothing behind")
}

// MaxDispatchers bounds the dispatchers of all targets together, and
// MaxSpanKeyBytes the bytes of their span keys (which a peer chooses); a
// removal gives the room back.
func TestServiceWideBoundsOnDispatchersAndSpanKeys(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.MaxDispatchers = 2; o.MaxSpanKeyBytes = 10 }, hooks{})
	h.advanceSchema(100)
	ctx := context.Background()
	reg := func(n uint64, target messaging.Target, start, end string) error {
		return h.svc.Register(ctx, messaging.RegisterRequest{Dispatcher: common.DispatcherIDFromUint64(n), Registration: messaging.RegistrationID(n),
			Span: common.Span{TableID: int64(n), StartKey: []byte(start), EndKey: []byte(end)}, StartTs: 1, Target: target})
	}
	require.NoError(t, reg(1, testTarget, "aaaa", "bbbb"))
	require.ErrorIs(t, reg(2, "collector-2", "aaa", "bbbb"), messaging.ErrLimitExceeded, "11 bytes of keys")
	require.NoError(t, reg(2, "collector-2", "", "z"))
	require.ErrorIs(t, reg(3, "collector-3", "", ""), messaging.ErrLimitExceeded, "a third dispatcher")
	require.Equal(t, 1.0, testutilCounter(h.svc.metrics.refusedControl.WithLabelValues(refusedSpanKeyBytes)))
	require.Equal(t, 1.0, testutilCounter(h.svc.metrics.refusedControl.WithLabelValues(refusedMaxDispatchersTotal)))
	require.NoError(t, h.svc.Remove(ctx, messaging.RemoveRequest{Dispatcher: common.DispatcherIDFromUint64(1), Registration: 1}))
	require.NoError(t, reg(3, "collector-3", "abcd", "bcde"), "the removal gave its room back")
}

// A reset may move the epoch forward by at most MaxEpochStep: a jump to
// 2^64-1 would leave the registration unable to reset again.
func TestResetFarAheadIsRefused(t *testing.T) {
	h := newHarness(t, nil, hooks{})
	h.advanceSchema(100)
	id := h.register(1, 1)
	reg := h.regOf(id)
	ctx := context.Background()
	for _, epoch := range []uint64{^uint64(0), 2 + messaging.MaxEpochStep} {
		err := h.svc.Reset(ctx, messaging.ResetRequest{Dispatcher: id, Registration: reg, Epoch: epoch, StartTs: 1})
		require.ErrorIs(t, err, messaging.ErrInvalidRequest, "epoch %d", epoch)
	}
	snap, err := h.svc.Inspect(id)
	require.NoError(t, err)
	require.Equal(t, uint64(1), snap.Epoch)
	require.Equal(t, 2.0, testutilCounter(h.svc.metrics.refusedControl.WithLabelValues(refusedEpochJump)))
	require.NoError(t, h.svc.Reset(ctx, messaging.ResetRequest{Dispatcher: id, Registration: reg, Epoch: 1 + messaging.MaxEpochStep, StartTs: 1}),
		"the largest step is accepted")
}

// A control call whose caller already gave up (its context ended) is
// refused with ErrUnavailable wrapping the context's error, and does
// nothing: the dispatcher is not registered, not reset, not removed, and
// no checkpoint is recorded.
func TestControlCallsOfACallerThatGaveUpDoNothing(t *testing.T) {
	h, id, reg := deliveringOneDispatcher(t)
	gone, cancel := context.WithCancel(context.Background())
	cancel()

	other := messaging.RegisterRequest{Dispatcher: common.DispatcherIDFromUint64(2), Registration: 200, Span: common.TableSpan(2), StartTs: 1, Target: testTarget}
	for name, err := range map[string]error{
		"register": h.svc.Register(gone, other),
		"reset":    h.svc.Reset(gone, messaging.ResetRequest{Dispatcher: id, Registration: reg, Epoch: 2, StartTs: 1}),
		"remove":   h.svc.Remove(gone, messaging.RemoveRequest{Dispatcher: id, Registration: reg}),
		"heartbeat": func() error {
			_, err := h.svc.Heartbeat(gone, messaging.HeartbeatRequest{Checkpoints: []messaging.DispatcherCheckpoint{{Dispatcher: id, Registration: reg, Epoch: 1, Ts: 10}}})
			return err
		}(),
	} {
		require.ErrorIs(t, err, messaging.ErrUnavailable, name)
		require.ErrorIs(t, err, context.Canceled, name)
	}
	_, err := h.svc.Inspect(other.Dispatcher)
	require.ErrorIs(t, err, messaging.ErrUnknownDispatcher, "not registered")
	snap, err := h.svc.Inspect(id)
	require.NoError(t, err, "not removed")
	require.Equal(t, uint64(1), snap.Epoch, "not reset")
	require.Equal(t, common.Ts(1), snap.Checkpoint, "no checkpoint recorded")
	require.NoError(t, h.svc.Register(context.Background(), other), "the refused register left nothing behind")
}

// deliveringOneDispatcher is a service with dispatcher 1 registered on
// table 1, whose first row the collector has received (resolved-ts 10).
func deliveringOneDispatcher(t *testing.T) (*harness, common.DispatcherID, messaging.RegistrationID) {
	t.Helper()
	h := newHarness(t, nil, hooks{})
	h.advanceSchema(100)
	id := h.register(1, 1)
	reg := h.regOf(id)
	h.push(1, 10, row("a", 4, 5))
	h.check.waitResolved(id, 10)
	return h, id, reg
}

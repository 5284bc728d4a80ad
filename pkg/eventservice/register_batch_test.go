package eventservice

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// TestRegisterBatchJudgesEachEntryAsRegisterWould: a batch registers its
// new dispatchers (each then gets its handshake and progress), accepts a
// repeat of a current registration, refuses another registration of a
// registered ID and an invalid entry without refusing the others, and
// takes a dispatcher over for an entry that asks to.
func TestRegisterBatchJudgesEachEntryAsRegisterWould(t *testing.T) {
	h := newHarness(t, nil, hooks{})
	h.advanceSchema(1 << 40)
	taken := h.register(1, 10)
	h.check.waitResolved(taken, 10)
	entry := func(n uint64, reg messaging.RegistrationID) messaging.RegisterRequest {
		return messaging.RegisterRequest{Dispatcher: common.DispatcherIDFromUint64(n), Registration: reg,
			Span: common.TableSpan(int64(n)), StartTs: 10, Target: testTarget}
	}
	fresh2, fresh3 := entry(2, 20), entry(3, 30)
	repeat := entry(2, 20)
	other := entry(1, 99) // another registration of a registered ID
	invalid := entry(4, 0)
	takeover := entry(1, 21)
	takeover.Replace = true
	h.check.expect(fresh2.Dispatcher, 20)
	h.check.expect(fresh3.Dispatcher, 30)

	reply, err := h.svc.RegisterBatch(context.Background(), messaging.RegisterBatchRequest{Requests: []messaging.RegisterRequest{
		fresh2, fresh3, repeat, other, invalid,
	}})
	require.NoError(t, err)
	require.Equal(t, []messaging.Code{messaging.CodeOK, messaging.CodeOK, messaging.CodeOK, messaging.CodeDispatcherExists,
		messaging.CodeInvalidRequest}, reply.Codes)
	h.regs[fresh2.Dispatcher], h.regs[fresh3.Dispatcher] = 20, 30
	h.push(2, 40)
	h.push(3, 40)
	h.check.waitResolved(fresh2.Dispatcher, 40)
	h.check.waitResolved(fresh3.Dispatcher, 40)

	h.check.expect(taken, 21)
	reply, err = h.svc.RegisterBatch(context.Background(), messaging.RegisterBatchRequest{Requests: []messaging.RegisterRequest{takeover}})
	require.NoError(t, err)
	require.Equal(t, []messaging.Code{messaging.CodeOK}, reply.Codes)
	h.regs[taken] = 21
	h.push(1, 50)
	h.check.waitResolved(taken, 50)
	require.Equal(t, 3, h.svc.Stats().Dispatchers)

	_, err = h.svc.RegisterBatch(context.Background(), messaging.RegisterBatchRequest{})
	require.ErrorIs(t, err, messaging.ErrInvalidRequest)
	_, err = h.svc.RegisterBatch(context.Background(), messaging.RegisterBatchRequest{Requests: make([]messaging.RegisterRequest, messaging.MaxRegisterBatch+1)})
	require.ErrorIs(t, err, messaging.ErrInvalidRequest)
	h.check.assertClean()
}

// TestRegisterBatchOnAClosedServiceRefusesEveryEntry: entries of a batch
// that arrives after Close are refused as closed, none registered.
func TestRegisterBatchOnAClosedServiceRefusesEveryEntry(t *testing.T) {
	h := newHarness(t, nil, hooks{})
	require.NoError(t, h.svc.Close())
	reply, err := h.svc.RegisterBatch(context.Background(), messaging.RegisterBatchRequest{Requests: []messaging.RegisterRequest{
		{Dispatcher: common.DispatcherIDFromUint64(1), Registration: 1, Span: common.TableSpan(1), Target: testTarget},
	}})
	require.NoError(t, err)
	require.Equal(t, []messaging.Code{messaging.CodeClosed}, reply.Codes)
	require.Zero(t, h.svc.Stats().Dispatchers)
}

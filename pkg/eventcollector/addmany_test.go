package eventcollector

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// TestAddDispatchersRegistersInBatches: many dispatchers take one
// RegisterBatch call per messaging.MaxRegisterBatch; an entry the service
// refuses (asked again alone, it fails with the service's own error, which
// says why), a duplicate and an invalid spec fail alone and leave no
// state, every other dispatcher is added with its slot and takes messages.
func TestAddDispatchersRegistersInBatches(t *testing.T) {
	h := newCrafted(t, nil, nil)
	const n = messaging.MaxRegisterBatch + 10
	refused := did(7)
	h.svc.refuseEntry = func(r messaging.RegisterRequest) bool { return r.Dispatcher == refused }
	specs := make([]DispatcherSpec, 0, n+2)
	for i := uint64(1); i <= n; i++ {
		specs = append(specs, DispatcherSpec{ID: did(i), Span: common.TableSpan(int64(i)), StartTs: 10})
	}
	specs = append(specs, DispatcherSpec{ID: did(3), Span: common.TableSpan(3), StartTs: 10}) // a duplicate
	specs = append(specs, DispatcherSpec{Span: common.TableSpan(1)})                          // no ID
	errs := h.coll.AddDispatchers(context.Background(), specs)
	for i, err := range errs {
		switch {
		case specs[i].ID == refused:
			require.ErrorIs(t, err, messaging.ErrLimitExceeded)
			require.ErrorContains(t, err, "the test's service refuses", "the service's own error, asked alone")
		case i == n:
			require.ErrorIs(t, err, ErrDispatcherExists)
		case i == n+1:
			require.ErrorIs(t, err, ErrInvalidArgument)
		default:
			require.NoError(t, err, "spec %d", i)
		}
	}
	h.svc.mu.Lock()
	require.Equal(t, []int{messaging.MaxRegisterBatch, 10}, h.svc.batches, "one call per batch, without the entries refused before it")
	h.svc.mu.Unlock()
	_, err := h.coll.Dispatcher(refused)
	require.ErrorIs(t, err, ErrUnknownDispatcher, "a refused entry leaves no state")
	require.Equal(t, n-1, h.coll.Stats().Dispatchers)

	id := did(n)
	h.deliver(handshake(id, 1, 10), &messaging.ResolvedBatch{Entries: []messaging.Resolved{entry(id, 1, 1, 20, h.slotOf(id))}})
	require.Equal(t, common.Ts(20), h.sink.CheckpointOf(id))
	h.deliver(handshake(refused, 1, 10))
	require.Equal(t, uint64(1), h.coll.Stats().UnknownIgnored)
}

package eventcollector

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventservice"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

func TestOptionsReportEveryBadField(t *testing.T) {
	_, err := New(Options{HeartbeatInterval: -time.Second, MaxDrain: -1, ExpectedDispatchers: maxExpectedDispatchers + 1})
	require.ErrorIs(t, err, ErrInvalidOptions)
	for _, f := range []string{"Service", "Inbox", "Sink", "Target", "HeartbeatInterval", "MaxDrain", "ExpectedDispatchers"} {
		require.Contains(t, err.Error(), f)
	}

	inproc, err := messaging.NewInProcess(messaging.InProcessOptions{})
	require.NoError(t, err)
	defer inproc.Close()
	inbox, err := inproc.Register(testTarget)
	require.NoError(t, err)
	good := Options{Service: newRecordingService(), Inbox: inbox, Sink: NewMemorySink()}
	o := good.EnsureDefaults()
	require.Equal(t, testTarget, o.Target, "the inbox names the target")
	require.Equal(t, DefaultHeartbeatInterval, o.HeartbeatInterval)
	require.Equal(t, DefaultMaxDrain, o.MaxDrain)
	require.NotNil(t, o.Clock)
	require.NotNil(t, o.Logger)
	require.NoError(t, o.Validate())

	bad := good
	bad.Target = "someone-else"
	bad.MaxDrain = maxMaxDrain + 1
	err = bad.EnsureDefaults().Validate()
	require.ErrorIs(t, err, ErrInvalidOptions)
	require.Contains(t, err.Error(), "not the inbox's target")
	require.Contains(t, err.Error(), "MaxDrain")
}

func TestLifecycle(t *testing.T) {
	h := newCrafted(t, nil, nil)
	require.NoError(t, h.coll.Start(), "second Start is a no-op")
	require.NoError(t, h.coll.Close())
	require.NoError(t, h.coll.Close(), "idempotent")
	require.ErrorIs(t, h.coll.Start(), ErrClosed)
	require.ErrorIs(t, h.coll.AddDispatcher(context.Background(), did(1), common.TableSpan(1), 10), ErrClosed)
	require.ErrorIs(t, h.coll.RemoveDispatcher(context.Background(), did(1)), ErrClosed)

	// Close without Start.
	inbox, err := h.inproc.Register("never-started")
	require.NoError(t, err)
	c, err := New(Options{Service: h.svc, Inbox: inbox, Sink: NewMemorySink()})
	require.NoError(t, err)
	require.NoError(t, c.Close())
}

func TestAddAndRemoveDispatcherErrors(t *testing.T) {
	h := newCrafted(t, nil, nil)
	err := h.coll.AddDispatcher(context.Background(), common.DispatcherID{}, common.Span{TableID: -1}, 10)
	require.ErrorIs(t, err, ErrInvalidArgument)
	require.Contains(t, err.Error(), "zero dispatcher id")
	require.ErrorIs(t, err, common.ErrInvalidSpan)

	require.NoError(t, h.coll.AddDispatcher(context.Background(), did(1), common.TableSpan(1), 10))
	require.ErrorIs(t, h.coll.AddDispatcher(context.Background(), did(1), common.TableSpan(1), 10), ErrDispatcherExists)

	// A refused registration leaves no state behind.
	h.svc.mu.Lock()
	h.svc.registerErr = eventservice.ErrClosed
	h.svc.mu.Unlock()
	require.ErrorIs(t, h.coll.AddDispatcher(context.Background(), did(2), common.TableSpan(2), 10), eventservice.ErrClosed)
	_, err = h.coll.Dispatcher(did(2))
	require.ErrorIs(t, err, ErrUnknownDispatcher)
	require.Equal(t, 1, h.coll.Stats().Dispatchers)

	h.svc.mu.Lock()
	h.svc.registerErr = nil
	h.svc.mu.Unlock()

	require.ErrorIs(t, h.coll.RemoveDispatcher(context.Background(), did(3)), ErrUnknownDispatcher)
	// The service not knowing the dispatcher is not an error: it is gone.
	h.svc.mu.Lock()
	h.svc.removeErr = messaging.ErrUnknownDispatcher
	h.svc.mu.Unlock()
	require.NoError(t, h.coll.RemoveDispatcher(context.Background(), did(1)))
	// Another failure is reported, and the state is dropped all the same.
	require.NoError(t, h.coll.AddDispatcher(context.Background(), did(1), common.TableSpan(1), 10))
	boom := errors.New("remove failed")
	h.svc.mu.Lock()
	h.svc.removeErr = boom
	h.svc.mu.Unlock()
	require.ErrorIs(t, h.coll.RemoveDispatcher(context.Background(), did(1)), boom)
	require.Zero(t, h.coll.Stats().Dispatchers)
}

// Close stops the receive goroutine between messages: the sink call in
// flight finishes (Close waits for it), the rest of the batch is not
// applied.
func TestCloseWaitsForTheSinkCallInFlightOnly(t *testing.T) {
	block := &blockingSinkForTest{entered: make(chan struct{}), release: make(chan struct{})}
	h := newCrafted(t, func(s Sink) Sink { block.Sink = s; return block }, nil)
	t.Cleanup(block.unblock)
	id := did(1)
	require.NoError(t, h.coll.AddDispatcher(context.Background(), id, common.TableSpan(1), 10))
	require.NoError(t, h.inproc.Send(testTarget, []messaging.Message{handshake(id, 1, 10),
		dml(id, 1, 2, false, row("a", 15, 20)), dml(id, 1, 3, false, row("b", 21, 25)), resolved(id, 1, 3, 30)}))
	<-block.entered
	closed := make(chan error, 1)
	go func() { closed <- h.coll.Close() }()
	<-h.coll.closing // Close has begun and now waits for the receive goroutine
	block.unblock()
	require.NoError(t, <-closed)
	require.Equal(t, []string{"a"}, keys(h.sink.Applied(id)))
	require.Zero(t, h.sink.CheckpointOf(id))
}

// Messages accepted before the transport closed are still applied.
func TestInboxClosedBeforeStartIsDrained(t *testing.T) {
	inproc, err := messaging.NewInProcess(messaging.InProcessOptions{})
	require.NoError(t, err)
	inbox, err := inproc.Register(testTarget)
	require.NoError(t, err)
	sink := NewMemorySink()
	c, err := New(Options{Service: newRecordingService(), Inbox: inbox, Sink: sink})
	require.NoError(t, err)
	c.knobs.registration = craftedReg
	id := did(1)
	require.NoError(t, c.AddDispatcher(context.Background(), id, common.TableSpan(1), 10))
	require.NoError(t, inproc.Send(testTarget, []messaging.Message{handshake(id, 1, 10),
		dml(id, 1, 2, false, row("a", 15, 20)), resolved(id, 1, 2, 30)}))
	inproc.Close()
	require.NoError(t, c.Start())
	require.NoError(t, sink.WaitCheckpoint(testCtx(t), id, 30))
	require.NoError(t, c.Close())
}

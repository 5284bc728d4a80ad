package eventcollector

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
)

// asyncSinkForTest is an AsyncSink double (the edge under test is the
// collector's use of durable acknowledgements): it wraps a MemorySink,
// queues checkpoints instead of confirming them, and makes a queued one
// durable when the test says so.
type asyncSinkForTest struct {
	*MemorySink
	mu       sync.Mutex
	durable  func(common.DispatcherID, uint64, common.Ts)
	epochs   map[common.DispatcherID]uint64
	queued   map[common.DispatcherID][]common.Ts
	failNext map[common.DispatcherID]error
}

func newAsyncSinkForTest() *asyncSinkForTest {
	return &asyncSinkForTest{MemorySink: NewMemorySink(), epochs: map[common.DispatcherID]uint64{},
		queued: map[common.DispatcherID][]common.Ts{}, failNext: map[common.DispatcherID]error{}}
}

func (s *asyncSinkForTest) SetDurable(f func(common.DispatcherID, uint64, common.Ts)) { s.durable = f }

func (s *asyncSinkForTest) BeginEpoch(id common.DispatcherID, epoch uint64, startTs common.Ts) error {
	s.mu.Lock()
	s.epochs[id] = epoch
	s.queued[id] = nil // what was queued and not persisted is gone
	s.mu.Unlock()
	return s.MemorySink.BeginEpoch(id, epoch, startTs)
}

func (s *asyncSinkForTest) ApplyRows(id common.DispatcherID, rows []common.Row) error {
	s.mu.Lock()
	err := s.failNext[id]
	delete(s.failNext, id)
	s.mu.Unlock()
	if err != nil {
		return err
	}
	return s.MemorySink.ApplyRows(id, rows)
}

func (s *asyncSinkForTest) Checkpoint(id common.DispatcherID, ts common.Ts) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queued[id] = append(s.queued[id], ts)
	return nil
}

// persist makes id's queued checkpoints up to ts durable.
func (s *asyncSinkForTest) persist(id common.DispatcherID, ts common.Ts) {
	s.mu.Lock()
	epoch := s.epochs[id]
	s.mu.Unlock()
	s.durable(id, epoch, ts)
}

// With an AsyncSink, a checkpoint counts once the sink says it is
// durable: it is not heartbeated before, and a reset starts from the last
// durable checkpoint, not from one the sink had only queued.
func TestAsyncSinkCheckpointsCountWhenDurable(t *testing.T) {
	sink := newAsyncSinkForTest()
	h := newCrafted(t, func(Sink) Sink { return sink }, nil)
	id := did(1)
	require.NoError(t, h.coll.AddDispatcher(context.Background(), id, common.TableSpan(1), 10))
	h.deliver(handshake(id, 1, 10), dml(id, 1, 2, false, row("a", 11, 12)), resolved(id, 1, 2, 20))
	require.Equal(t, common.Ts(10), h.status(id).Checkpoint, "queued, not durable")
	h.tick()
	h.svc.mu.Lock()
	require.Empty(t, h.svc.heartbeats, "nothing durable to report")
	h.svc.mu.Unlock()

	sink.persist(id, 20)
	require.Equal(t, common.Ts(20), h.status(id).Checkpoint)
	h.tick()
	hb := <-h.svc.heartbeatCh
	require.Equal(t, common.Ts(20), hb.checkpoint)

	// More rows and a checkpoint the sink only queues; then its apply
	// fails: the reset starts from the durable 20, not the queued 30.
	h.deliver(dml(id, 1, 3, false, row("b", 21, 22)), resolved(id, 1, 3, 30))
	sink.mu.Lock()
	sink.failNext[id] = errors.New("the database went away")
	sink.mu.Unlock()
	h.deliver(dml(id, 1, 4, false, row("c", 31, 32)))
	r := h.svc.nextReset(t)
	require.Equal(t, common.Ts(20), r.startTs)
	sink.durable(id, 1, 30) // a late acknowledgement of the old epoch: ignored
	require.Equal(t, common.Ts(20), h.status(id).Checkpoint)
}

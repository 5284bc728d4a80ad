package eventcollector

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventservice"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

func TestEndToEndRowsDDLsCheckpointsAndHeartbeats(t *testing.T) {
	h := newStack(t, stackConfig{})
	ids := []common.DispatcherID{h.add(1, 10), h.add(2, 10), h.add(3, 10)}
	require.NoError(t, h.schema.AddDDL(schemastore.DDL{TableID: 1, CommitTs: 25, Query: "alter t1 at 25"}))
	require.NoError(t, h.schema.AddDDL(schemastore.DDL{TableID: 2, CommitTs: 35, Query: "alter t2 at 35"}))
	h.advanceSchema(1000)
	for n := uint64(1); n <= 3; n++ {
		h.push(n, 50, row(fmt.Sprintf("t%d-a", n), 15, 20), row(fmt.Sprintf("t%d-b", n), 15, 20),
			row(fmt.Sprintf("t%d-c", n), 21, 25), row(fmt.Sprintf("t%d-d", n), 26, 30), row(fmt.Sprintf("t%d-e", n), 27, 30))
		h.push(n, 100, row(fmt.Sprintf("t%d-f", n), 55, 60))
	}
	for _, id := range ids {
		h.waitCheckpoint(id, 100)
	}
	for i, id := range ids {
		ep := h.mem.Epochs(id)
		require.Len(t, ep, 1, "no reset on a clean transport")
		require.Equal(t, uint64(1), ep[0].Epoch)
		require.Equal(t, common.Ts(10), ep[0].StartTs)
		n := i + 1
		want := []string{"a", "b", "c", "d", "e", "f"}
		for j := range want {
			want[j] = fmt.Sprintf("t%d-%s", n, want[j])
		}
		require.Equal(t, want, keys(ep[0].Rows), "every row once, in order")
		require.Equal(t, common.Ts(100), ep[0].LastCheckpoint)
		h.assertExactlyUpstream(id)
	}
	require.Equal(t, []common.Ts{25}, ddlTs(h.mem.AppliedDDLs(ids[0])))
	require.Equal(t, []common.Ts{35}, ddlTs(h.mem.AppliedDDLs(ids[1])))
	require.Empty(t, h.mem.AppliedDDLs(ids[2]))
	st := h.coll.Stats()
	require.Zero(t, st.TotalResets())
	require.Equal(t, uint64(18), st.RowsApplied)
	require.Equal(t, common.Ts(100), st.MinCheckpoint)

	// Heartbeats carry the checkpoints to the service and on to the store.
	for _, id := range ids {
		ds, err := h.store.Dispatcher(id)
		require.NoError(t, err)
		require.Equal(t, common.Ts(10), ds.Checkpoint, "no heartbeat yet")
	}
	h.tick()
	for _, id := range ids {
		ds, err := h.store.Dispatcher(id)
		require.NoError(t, err)
		require.Equal(t, common.Ts(100), ds.Checkpoint)
		cs, err := h.coll.Dispatcher(id)
		require.NoError(t, err)
		require.Equal(t, common.Ts(100), cs.LastHeartbeat)
	}
	require.Equal(t, uint64(3), h.coll.Stats().Heartbeats)
}

func ddlTs(ddls []messaging.DDL) []common.Ts {
	out := make([]common.Ts, len(ddls))
	for i, d := range ddls {
		out[i] = d.CommitTs
	}
	return out
}

// dropperForTest forwards sends, except that once armed it silently drops
// the next send carrying a DML batch (as a lossy network would), and
// signals it.
type dropperForTest struct {
	inner   messaging.Transport
	armed   atomic.Bool
	dropped chan []messaging.Message
}

func (d *dropperForTest) Send(to messaging.Target, msgs []messaging.Message) error {
	for _, m := range msgs {
		if m.Kind() == messaging.KindDMLBatch && d.armed.CompareAndSwap(true, false) {
			d.dropped <- msgs
			return nil
		}
	}
	return d.inner.Send(to, msgs)
}

func TestDroppedMessageResetsAndRedeliversFromCheckpoint(t *testing.T) {
	drop := &dropperForTest{dropped: make(chan []messaging.Message, 1)}
	h := newStack(t, stackConfig{transport: func(tr messaging.Transport) messaging.Transport { drop.inner = tr; return drop }})
	id := h.add(1, 10)
	h.advanceSchema(1000)
	h.push(1, 40, row("a", 15, 20), row("b", 21, 30))
	h.waitCheckpoint(id, 40)
	h.tick() // the store learns checkpoint 40

	drop.armed.Store(true)
	h.push(1, 60, row("c", 45, 50), row("d", 51, 55))
	select {
	case <-drop.dropped:
	case <-testCtx(t).Done():
		t.Fatal("nothing dropped")
	}
	// Only progress follows the lost batch: its seq reveals the gap.
	h.push(1, 80)
	h.waitCheckpoint(id, 80)

	st := h.coll.Stats()
	require.Equal(t, uint64(1), st.Resets[ResetGap])
	require.Equal(t, uint64(1), st.TotalResets())
	ep := h.mem.Epochs(id)
	require.Len(t, ep, 2)
	require.Equal(t, uint64(1), ep[0].Epoch)
	require.Equal(t, []string{"a", "b"}, keys(ep[0].Rows))
	require.Equal(t, uint64(2), ep[1].Epoch)
	require.Equal(t, common.Ts(40), ep[1].StartTs, "the new epoch starts at the checkpoint")
	require.Equal(t, []string{"c", "d"}, keys(ep[1].Rows))
	h.assertExactlyUpstream(id)
	cs, err := h.coll.Dispatcher(id)
	require.NoError(t, err)
	require.Equal(t, uint64(2), cs.Epoch)
	require.False(t, cs.PendingReset)

	h.tick()
	ds, err := h.store.Dispatcher(id)
	require.NoError(t, err)
	require.Equal(t, common.Ts(80), ds.Checkpoint, "heartbeats reach the store in the new epoch")
}

// healableTransportForTest sends through faulty until healed, then
// straight to inner.
type healableTransportForTest struct {
	faulty *messaging.Faulty
	inner  messaging.Transport
	healed atomic.Bool
}

func (s *healableTransportForTest) Send(to messaging.Target, msgs []messaging.Message) error {
	if s.healed.Load() {
		return s.inner.Send(to, msgs)
	}
	return s.faulty.Send(to, msgs)
}

// A lossy, refusing transport: whatever is lost, once the transport heals
// and one more resolved-ts flows, every dispatcher's sink holds exactly the
// upstream rows, and no epoch applied a row twice.
func TestFaultyTransportConverges(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			tr := &healableTransportForTest{}
			h := newStack(t, stackConfig{transport: func(inner messaging.Transport) messaging.Transport {
				f, err := messaging.NewFaulty(inner, messaging.FaultOptions{Seed: seed, DropRate: 0.15, RefuseRate: 0.1})
				require.NoError(t, err)
				tr.faulty, tr.inner = f, inner
				return tr
			}, svc: func(o *eventservice.Options) { o.BatchRows = 2 }})
			const tables, minRounds, maxRounds = 4, 10, 2000
			var ids []common.DispatcherID
			for n := uint64(1); n <= tables; n++ {
				ids = append(ids, h.add(n, 10))
			}
			h.advanceSchema(1 << 40)
			ts := common.Ts(10)
			// Traffic until the faults made the collector reset a few times
			// (sends are asynchronous, so the number of rounds varies).
			for r := 0; r < minRounds || h.coll.Stats().TotalResets() < 3; r++ {
				require.Less(t, r, maxRounds, "faults never caused a reset: %+v", tr.faulty.Stats())
				for n := uint64(1); n <= tables; n++ {
					var rows []common.Row
					for k := range 3 {
						c := ts + common.Ts(k+1)*3
						rows = append(rows, row(fmt.Sprintf("t%d-r%d-k%d", n, r, k), c-1, c))
					}
					h.push(n, ts+10, rows...)
				}
				ts += 10
				h.tick() // heartbeats and reset retries interleave with the traffic
			}
			tr.healed.Store(true)
			final := ts + 10
			for n := uint64(1); n <= tables; n++ {
				h.push(n, final)
			}
			for _, id := range ids {
				h.waitCheckpoint(id, final)
				h.assertExactlyUpstream(id)
			}
			fs := tr.faulty.Stats()
			t.Logf("faults %+v; collector %+v", fs, h.coll.Stats())
		})
	}
}

// blockingSinkForTest blocks its first ApplyRows until released.
type blockingSinkForTest struct {
	Sink
	entered chan struct{}
	release chan struct{}
	once    sync.Once
	calls   atomic.Int64
}

func (b *blockingSinkForTest) ApplyRows(id common.DispatcherID, rows []common.Row) error {
	if b.calls.Add(1) == 1 {
		close(b.entered)
		<-b.release
	}
	return b.Sink.ApplyRows(id, rows)
}

func (b *blockingSinkForTest) unblock() { b.once.Do(func() { close(b.release) }) }

// A blocked sink stops the draining; the bounded inbox fills and the
// service's sends are refused (back-pressure), nothing is buffered beyond
// the inbox, and everything arrives once the sink moves again.
func TestSlowSinkPushesBackOnTheService(t *testing.T) {
	const capacity = 8
	block := &blockingSinkForTest{entered: make(chan struct{}), release: make(chan struct{})}
	count := &countingTransportForTest{busy: make(chan struct{})}
	h := newStack(t, stackConfig{
		capacity:  capacity,
		transport: func(tr messaging.Transport) messaging.Transport { count.inner = tr; return count },
		svc: func(o *eventservice.Options) {
			o.BatchRows = 1 // one message per row
			o.MaxMessagesPerTask = 4
		},
		coll: func(o *Options) { o.MaxDrain = 2 },
		sink: func(s Sink) Sink { block.Sink = s; return block },
	})
	t.Cleanup(block.unblock) // before the stack's cleanup: Close waits for the sink
	count.inbox = h.inbox
	id := h.add(1, 10)
	h.advanceSchema(1000)
	var rows []common.Row
	for i := range 40 {
		c := common.Ts(20 + i)
		rows = append(rows, row(fmt.Sprintf("k%02d", i), c-1, c))
	}
	h.push(1, 100, rows...)

	ctx := testCtx(t)
	select {
	case <-block.entered:
	case <-ctx.Done():
		t.Fatal("sink never called")
	}
	select {
	case <-count.busy:
	case <-ctx.Done():
		t.Fatal("the service was never refused")
	}
	require.LessOrEqual(t, h.inbox.Len(), capacity)
	require.Equal(t, int64(1), block.calls.Load(), "the collector waits on the sink, not on a buffer")
	require.Empty(t, h.mem.Applied(id))
	var taken uint64
	for _, n := range h.coll.Stats().Messages {
		taken += n
	}
	require.LessOrEqual(t, taken, uint64(2), "at most one drained batch (MaxDrain) left the inbox")

	block.unblock()
	h.waitCheckpoint(id, 100)
	ep := h.mem.Epochs(id)
	require.Len(t, ep, 1, "refusals are back-pressure, not loss: no reset")
	require.Equal(t, keys(rows), keys(ep[0].Rows))
	h.assertExactlyUpstream(id)
	require.Positive(t, count.busys.Load())
	require.LessOrEqual(t, count.maxLen.Load(), int64(capacity))
	require.Zero(t, h.coll.Stats().TotalResets())
}

// failOnceSinkForTest fails the first ApplyRows of epoch 1.
type failOnceSinkForTest struct {
	Sink
	failed bool
	epoch  uint64
}

func (f *failOnceSinkForTest) BeginEpoch(id common.DispatcherID, epoch uint64, startTs common.Ts) error {
	f.epoch = epoch
	return f.Sink.BeginEpoch(id, epoch, startTs)
}

func (f *failOnceSinkForTest) ApplyRows(id common.DispatcherID, rows []common.Row) error {
	if !f.failed && f.epoch == 1 && rows[0].CommitTs > 30 {
		f.failed = true
		return errSinkForTest
	}
	return f.Sink.ApplyRows(id, rows)
}

func TestSinkErrorRedeliversFromCheckpoint(t *testing.T) {
	fail := &failOnceSinkForTest{}
	h := newStack(t, stackConfig{sink: func(s Sink) Sink { fail.Sink = s; return fail }})
	id := h.add(1, 10)
	h.advanceSchema(1000)
	h.push(1, 30, row("a", 15, 20))
	h.waitCheckpoint(id, 30)
	h.push(1, 60, row("b", 35, 40), row("c", 45, 50))
	h.waitCheckpoint(id, 60)
	require.Equal(t, uint64(1), h.coll.Stats().Resets[ResetSinkError])
	ep := h.mem.Epochs(id)
	require.Len(t, ep, 2)
	require.Equal(t, common.Ts(30), ep[1].StartTs)
	require.Equal(t, []string{"b", "c"}, keys(ep[1].Rows))
	h.assertExactlyUpstream(id)
}

// A transaction larger than the split threshold arrives in Partial
// batches; no checkpoint lands inside it (the checking sink would see a
// checkpoint whose rows are not all applied) and nothing resets. Every
// resolved-ts sent inside the split transaction is below its commit-ts.
func TestLargeTransactionSplitAcrossBatches(t *testing.T) {
	var partials, resolvedInside atomic.Int64
	var mu sync.Mutex
	var violations []string // resolved-ts sent inside the split at or above its commit-ts
	h := newStack(t, stackConfig{
		transport: func(tr messaging.Transport) messaging.Transport {
			// One dispatcher, sends are serialised per dispatcher.
			inSplit := false
			var splitCommit common.Ts // commit-ts of the transaction being split
			return transportFuncForTest(func(to messaging.Target, msgs []messaging.Message) error {
				for _, m := range msgs {
					switch v := m.(type) {
					case *messaging.DMLBatch:
						inSplit = v.Partial
						if v.Partial {
							partials.Add(1)
							_, splitCommit = v.CommitTsRange()
						}
					case *messaging.Resolved:
						if inSplit {
							resolvedInside.Add(1)
							if v.Ts >= splitCommit {
								mu.Lock()
								violations = append(violations, fmt.Sprintf("resolved-ts %d inside the transaction at %d", v.Ts, splitCommit))
								mu.Unlock()
							}
						}
					}
				}
				return tr.Send(to, msgs)
			})
		},
		svc: func(o *eventservice.Options) {
			o.ScanLimitBytes, o.LargeTxnSplitBytes, o.BatchRows = 64, 64, 4
		},
	})
	id := h.add(1, 10)
	h.advanceSchema(1000)
	var rows []common.Row
	rows = append(rows, row("before", 15, 20))
	for i := range 40 {
		rows = append(rows, row(fmt.Sprintf("big-%02d", i), 25, 30))
	}
	rows = append(rows, row("after", 35, 40))
	h.push(1, 50, rows...)
	h.waitCheckpoint(id, 50)
	require.Positive(t, partials.Load(), "the transaction was split")
	// The split sends progress below the transaction (so the check below is
	// not vacuous), never at or above it.
	require.Positive(t, resolvedInside.Load(), "a resolved-ts was sent inside the split transaction")
	mu.Lock()
	require.Empty(t, violations)
	mu.Unlock()
	require.Zero(t, h.coll.Stats().TotalResets())
	ep := h.mem.Epochs(id)
	require.Len(t, ep, 1)
	require.Equal(t, []string{"before"}, keys(ep[0].Rows[:1]))
	h.assertExactlyUpstream(id)
}

type transportFuncForTest func(to messaging.Target, msgs []messaging.Message) error

func (f transportFuncForTest) Send(to messaging.Target, msgs []messaging.Message) error {
	return f(to, msgs)
}

func TestRemoveDispatcherUnregistersFromTheService(t *testing.T) {
	h := newStack(t, stackConfig{})
	a, b := h.add(1, 10), h.add(2, 10)
	h.advanceSchema(1000)
	h.push(1, 30, row("a", 15, 20))
	h.waitCheckpoint(a, 30)
	st, err := h.coll.Dispatcher(a)
	require.NoError(t, err)
	require.NoError(t, h.coll.RemoveDispatcher(context.Background(), a))
	require.ErrorIs(t, h.coll.RemoveDispatcher(context.Background(), a), ErrUnknownDispatcher)
	_, err = h.store.Dispatcher(a)
	require.ErrorIs(t, err, eventstore.ErrDispatcherNotFound)
	reply, err := h.svc.Heartbeat(context.Background(), messaging.HeartbeatRequest{Checkpoints: []messaging.DispatcherCheckpoint{
		{Dispatcher: a, Registration: st.Registration, Epoch: 1, Ts: 30}}})
	require.NoError(t, err)
	require.Equal(t, []messaging.Code{messaging.CodeUnknownDispatcher}, reply.Codes)

	// The other dispatcher is unaffected; a removed one can be added again.
	h.push(2, 40, row("x", 15, 20))
	h.waitCheckpoint(b, 40)
	require.NoError(t, h.coll.AddDispatcher(context.Background(), a, common.TableSpan(1), 30))
	require.ErrorIs(t, h.coll.AddDispatcher(context.Background(), a, common.TableSpan(1), 30), ErrDispatcherExists)
	h.push(1, 60, row("b", 45, 50))
	h.waitCheckpoint(a, 60)
	again, err := h.coll.Dispatcher(a)
	require.NoError(t, err)
	require.NotEqual(t, st.Registration, again.Registration, "a new registration, a new identity")
	require.Equal(t, []string{"a", "b"}, keys(h.mem.Applied(a)))
}

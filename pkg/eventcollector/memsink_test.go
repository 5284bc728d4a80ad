package eventcollector

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/touchahead"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

func TestMemorySinkRecordsPerEpochAndDeduplicates(t *testing.T) {
	s := NewMemorySink()
	id := did(1)
	require.Nil(t, s.Epochs(id))
	require.Nil(t, s.Applied(id))
	require.Zero(t, s.CheckpointOf(id))

	require.NoError(t, s.BeginEpoch(id, 1, 10))
	require.NoError(t, s.ApplyRows(id, []common.Row{row("a", 15, 20), row("b", 21, 30)}))
	require.NoError(t, s.ApplyDDL(id, &messaging.DDL{CommitTs: 30, Query: "alter"}))
	require.NoError(t, s.Checkpoint(id, 30))
	require.NoError(t, s.ApplyRows(id, []common.Row{row("c", 31, 40)}))
	require.NoError(t, s.BeginEpoch(id, 2, 30))
	newC := row("c", 31, 40)
	newC.Value = []byte("again")
	require.NoError(t, s.ApplyRows(id, []common.Row{newC, row("d", 41, 50)}))
	require.NoError(t, s.Checkpoint(id, 50))

	ep := s.Epochs(id)
	require.Len(t, ep, 2)
	require.Equal(t, EpochRecord{Epoch: 1, StartTs: 10, Rows: []common.Row{row("a", 15, 20), row("b", 21, 30), row("c", 31, 40)},
		DDLs: []messaging.DDL{{CommitTs: 30, Query: "alter"}}, Checkpoints: 1, LastCheckpoint: 30}, ep[0])
	require.Equal(t, uint64(2), ep[1].Epoch)
	require.Equal(t, 1, ep[1].Checkpoints)
	require.Equal(t, common.Ts(50), ep[1].LastCheckpoint)
	require.NoError(t, s.Checkpoint(id, 50))
	require.Equal(t, 1, s.Epochs(id)[1].CheckpointRegressions, "a checkpoint not above the last one is counted")
	require.Equal(t, []string{"a", "b", "c", "c", "d"}, keys(s.Applied(id)))
	dedup := s.Deduplicated(id)
	require.Equal(t, []string{"a", "b", "c", "d"}, keys(dedup))
	require.Equal(t, []byte("again"), dedup[2].Value, "the latest application wins")
	require.Equal(t, common.Ts(50), s.CheckpointOf(id))
	require.Len(t, s.AppliedDDLs(id), 1)
	require.Equal(t, []common.DispatcherID{id}, s.Dispatchers())

	// Snapshots are copies.
	ep[0].Rows[0] = row("zzz", 1, 2)
	require.Equal(t, "a", string(s.Epochs(id)[0].Rows[0].Key))

	// Calls without BeginEpoch land in an epoch-0 record.
	other := did(2)
	require.NoError(t, s.ApplyRows(other, []common.Row{row("x", 1, 2)}))
	require.NoError(t, s.ApplyRows(other, nil))
	require.NoError(t, s.ApplyRows(other, []common.Row{row("y", 3, 4), row("z", 3, 4)}))
	require.Equal(t, []string{"x", "y", "z"}, keys(s.Applied(other)), "the current epoch's batches, in order")
	require.NoError(t, s.ApplyRows(other, []common.Row{row("w", 5, 6)}))
	require.Equal(t, uint64(0), s.Epochs(other)[0].Epoch)
	require.Equal(t, []string{"x", "y", "z", "w"}, keys(s.Epochs(other)[0].Rows))

	// A checkpoint's counts are kept aside until the epoch's record is
	// read or the next epoch opens; either way each counts once, in its
	// own epoch.
	third := did(3)
	require.NoError(t, s.Checkpoint(third, 5)) // before any BeginEpoch: epoch 0
	require.NoError(t, s.BeginEpoch(third, 1, 5))
	require.NoError(t, s.Checkpoint(third, 6))
	require.Equal(t, 1, s.Epochs(third)[1].Checkpoints)
	require.NoError(t, s.Checkpoint(third, 7))
	s.CheckpointBatch(nil, nil) // nothing, and nothing lost
	cps := []SinkCheckpoint{{ID: third, Ts: 7}}
	s.CheckpointBatch(cps, make([]error, 1)) // a repeat: a regression
	eps := s.Epochs(third)
	require.Equal(t, []int{1, 3}, []int{eps[0].Checkpoints, eps[1].Checkpoints})
	require.Equal(t, []common.Ts{5, 7}, []common.Ts{eps[0].LastCheckpoint, eps[1].LastCheckpoint})
	require.Equal(t, []int{0, 1}, []int{eps[0].CheckpointRegressions, eps[1].CheckpointRegressions})
	require.Equal(t, eps, s.Epochs(third), "reading again changes nothing")
}

// TestMemorySinkCheckpointBatchIsCheckpointPerEntry: a batch records what
// the same Checkpoint calls would (counts, last, regressions, an epoch-0
// record for a dispatcher without BeginEpoch) and wakes a waiter once.
func TestMemorySinkCheckpointBatchIsCheckpointPerEntry(t *testing.T) {
	one, batch := NewMemorySink(), NewMemorySink()
	a, b := did(1), did(2)
	for _, s := range []*MemorySink{one, batch} {
		require.NoError(t, s.BeginEpoch(a, 1, 10))
	}
	cps := []SinkCheckpoint{{ID: a, Ts: 20}, {ID: b, Ts: 5}}
	for _, cp := range cps {
		require.NoError(t, one.Checkpoint(cp.ID, cp.Ts))
	}
	changed := batch.Changed()
	errs := []error{errors.New("stale"), errors.New("stale")}
	batch.CheckpointBatch(cps, errs)
	require.Equal(t, []error{nil, nil}, errs, "every entry's error is set")
	select {
	case <-changed:
	default:
		t.Fatal("a batch wakes the waiters")
	}
	// Again, a regression for a.
	regress := []SinkCheckpoint{{ID: a, Ts: 20}}
	require.NoError(t, one.Checkpoint(a, 20))
	batch.CheckpointBatch(regress, errs[:1])
	for _, id := range []common.DispatcherID{a, b} {
		require.Equal(t, one.Epochs(id), batch.Epochs(id), "dispatcher %v", id)
		require.Equal(t, one.CheckpointOf(id), batch.CheckpointOf(id))
	}
	require.Equal(t, 1, batch.Epochs(a)[0].CheckpointRegressions)
	require.Equal(t, uint64(0), batch.Epochs(b)[0].Epoch)
}

// TestMemorySinkSlotIsAHintCheckedByID: CheckpointBatch finds a
// dispatcher by its slot only when the slot holds that ID. A slot the
// collector gave to another dispatcher after a removal, a slot beyond the
// cache and a slot that lies all land on the entry's ID, and the
// dispatcher that held the slot before is left alone.
func TestMemorySinkSlotIsAHintCheckedByID(t *testing.T) {
	s := NewMemorySink()
	a, b, c := did(1), did(2), did(3)
	errs := make([]error, 1)
	s.CheckpointBatch([]SinkCheckpoint{{ID: a, Ts: 10, Slot: 0}}, errs)
	// b takes slot 0 over (a was removed at the collector).
	s.CheckpointBatch([]SinkCheckpoint{{ID: b, Ts: 20, Slot: 0}}, errs)
	s.CheckpointBatch([]SinkCheckpoint{{ID: b, Ts: 21, Slot: 0}}, errs)
	// A slot beyond the cache, and a slot that names b's for c.
	s.CheckpointBatch([]SinkCheckpoint{{ID: c, Ts: 30, Slot: maxSlotCache + 5}}, errs)
	s.CheckpointBatch([]SinkCheckpoint{{ID: c, Ts: 31, Slot: 0}}, errs)
	s.CheckpointBatch([]SinkCheckpoint{{ID: a, Ts: 11, Slot: 7}}, errs)
	require.Equal(t, common.Ts(11), s.CheckpointOf(a))
	require.Equal(t, 2, s.Epochs(a)[0].Checkpoints)
	require.Equal(t, common.Ts(21), s.CheckpointOf(b))
	require.Equal(t, 2, s.Epochs(b)[0].Checkpoints)
	require.Equal(t, common.Ts(31), s.CheckpointOf(c))
	require.Equal(t, 2, s.Epochs(c)[0].Checkpoints)
	s.mu.Lock()
	defer s.mu.Unlock()
	require.Len(t, s.mu.bySlot, 8, "the cache grows to the slots seen, not to a slot beyond its bound")
}

func TestMemorySinkWaitAndConcurrentReaders(t *testing.T) {
	s := NewMemorySink()
	id := did(1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, s.WaitCheckpoint(ctx, id, 1), context.Canceled)

	const n = 200
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 3 {
		wg.Go(func() {
			// Every snapshot is at least as far along as the previous one.
			var prevCheckpoint common.Ts
			prevLen := 0
			for {
				select {
				case <-stop:
					return
				default:
				}
				cp := s.CheckpointOf(id)
				dedup := s.Deduplicated(id)
				ep := s.Epochs(id)
				if !assert.GreaterOrEqual(t, cp, prevCheckpoint, "checkpoint went back") ||
					!assert.GreaterOrEqual(t, len(dedup), prevLen, "deduplicated rows went back") ||
					// The row at ts is applied before the checkpoint at ts,
					// and dedup was read after cp.
					!assert.GreaterOrEqual(t, len(dedup), int(cp/10), "checkpoint %d ahead of the rows", cp) ||
					!assert.LessOrEqual(t, len(ep), 1, "one epoch") {
					return
				}
				prevCheckpoint, prevLen = cp, len(dedup)
			}
		})
	}
	wg.Go(func() {
		if !assert.NoError(t, s.BeginEpoch(id, 1, 0)) {
			return
		}
		for i := 1; i <= n; i++ {
			ts := common.Ts(i * 10)
			if !assert.NoError(t, s.ApplyRows(id, []common.Row{row(fmt.Sprintf("k%03d", i), ts-1, ts)})) ||
				!assert.NoError(t, s.Checkpoint(id, ts)) {
				return
			}
		}
	})
	require.NoError(t, s.WaitCheckpoint(testCtx(t), id, n*10))
	close(stop)
	wg.Wait()
	require.Len(t, s.Deduplicated(id), n)
}

// requireOneCheckpoint asserts that the epoch got exactly one Checkpoint
// call, at ts.
func requireOneCheckpoint(t *testing.T, e EpochRecord, ts common.Ts) {
	t.Helper()
	require.Equal(t, 1, e.Checkpoints, "checkpoint calls")
	require.Equal(t, ts, e.LastCheckpoint)
}

// TestAFirstEpochIsOneObject: a dispatcher's first epoch record lives in
// its sink entry, and the entries are carved from chunks, so BeginEpoch of
// a new dispatcher allocates nothing of its own (a chunk and map growth
// now and then: less than one allocation a call on average, which
// AllocsPerRun rounds down to zero), not an entry, a record and a list of
// records: at a million dispatchers those were three million objects for
// each GC cycle to mark.
func TestAFirstEpochIsOneObject(t *testing.T) {
	s := NewMemorySink()
	var n uint64
	allocs := testing.AllocsPerRun(200, func() {
		n++
		if err := s.BeginEpoch(did(n), 1, 10); err != nil {
			panic(err)
		}
	})
	require.Zero(t, allocs)
	require.NoError(t, s.BeginEpoch(did(1), 2, 20))
	ep := s.Epochs(did(1))
	require.Len(t, ep, 2, "a later epoch still appends")
	require.Equal(t, []uint64{1, 2}, []uint64{ep[0].Epoch, ep[1].Epoch})
}

// TestMemorySinkCheckpointBatchOfManyChunks: a batch longer than the
// touch-ahead chunk (internal/touchahead) records every entry and sets
// every error, with slots that hold the entry, another dispatcher, or
// nothing.
func TestMemorySinkCheckpointBatchOfManyChunks(t *testing.T) {
	one, batch := NewMemorySink(), NewMemorySink()
	const n = 3*touchahead.Chunk + 5
	var cps []SinkCheckpoint
	for i := range n {
		cps = append(cps, SinkCheckpoint{ID: did(uint64(i + 1)), Slot: uint32(i % 7), Ts: common.Ts(10 + i)})
	}
	errs := make([]error, n)
	for i := range errs {
		errs[i] = errors.New("stale")
	}
	for _, cp := range cps {
		require.NoError(t, one.Checkpoint(cp.ID, cp.Ts))
	}
	batch.CheckpointBatch(cps, errs)
	batch.CheckpointBatch(cps, errs) // again: slots now cached, each a regression
	for _, cp := range cps {
		require.NoError(t, one.Checkpoint(cp.ID, cp.Ts))
	}
	require.Equal(t, make([]error, n), errs, "every entry's error is set")
	for _, cp := range cps {
		require.Equal(t, one.Epochs(cp.ID), batch.Epochs(cp.ID), "dispatcher %v", cp.ID)
	}
}

package eventstore

import (
	"fmt"

	"github.com/cockroachdb/pebble/v2"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/common"
)

// Write-behind. A subscription whose fresh floor is at or below its GC
// target (the minimum checkpoint) is asked only for ranges that start at
// or above from (a range may not start below its dispatcher's checkpoint,
// and a dispatcher joins only at or above the low watermark, itself at or
// above the GC target), so every scan of it is served from memory and
// pebble is never read for it. Its rows then need not be written to pebble
// at their commit: apply keeps them in memory only (planRows), and a
// dispatcher that keeps up checkpoints them before they would have to
// leave memory, so they are never written at all (the store is a cache of
// the upstream, and the write is work on the pipeline's cores).
//
// Before from moves above the GC target (an eviction, a drop), every row
// held only in memory is written, so that a scan that then goes to pebble
// finds each row above the checkpoints there. Versions must land in push
// order (a later row with the same commit-ts, start-ts and key replaces an
// earlier one, and pebble keeps the last write), so the rows held only in
// memory are written before any later push of the subscription is: when a
// push does not fit, apply puts them into its own batch ahead of the
// push's rows, those of earlier pushes of the same batch that it deferred
// included, and writes the subscription's later pushes of that batch too.
// What is left for the publishing step is a push deferred when it fitted
// and refused the store-wide budget by the time it was published; that
// push's rows and the memory-only rows are written there, in order, under
// the subscription's lock (spillLocked). A checkpoint that reaches from
// (trimFreshLocked) makes the subscription write-behind again.
//
// INVARIANT (under subscription.mu): if !writeBehindLocked, every committed
// row above the GC target is in pebble; either way every committed row
// above from is in the fresh rows, and if allWritten, every one of those
// above the GC target is in pebble.

// wbBatch is a subscription's part of the write batch being built. Only
// its write worker touches it.
type wbBatch struct {
	seq     uint64 // the batch it describes (Store.batchSeq)
	bytes   int64  // the fresh cost of its pushes deferred in the batch
	durable bool   // a push did not fit: the rest of the batch is written
}

// rowPlan is what apply does with a push's rows.
type rowPlan uint8

const (
	planWrite rowPlan = iota // into the batch
	planDefer                // into the fresh rows only
	planSpill                // into the batch, after the rows held only in memory
)

// writeBehindLocked reports whether sub's fresh rows may be held in memory
// only (f may be nil: no row committed yet). REQUIRES: sub.mu held.
func (sub *subscription) writeBehindLocked(f *freshRows) bool {
	from := sub.startTs
	if f != nil {
		from = f.from
	}
	return from <= sub.mu.gcTarget
}

// planRows decides what apply does with ev's rows, in batch seq: defer
// them while sub is write-behind and they fit its allowance (with its
// pushes already deferred in the batch) and the store's, as far as can be
// told before the commit; otherwise write them, after what sub holds only
// in memory if it is write-behind. Called by sub's write worker.
func (s *Store) planRows(ev *writeEvent, seq uint64) rowPlan {
	sub := ev.sub
	wb := &sub.wb
	if wb.seq != seq {
		*wb = wbBatch{seq: seq}
	}
	if s.fresh.limit <= 0 || wb.durable {
		return planWrite
	}
	sub.mu.Lock()
	defer sub.mu.Unlock()
	f := sub.mu.fresh
	if sub.mu.removed || !sub.writeBehindLocked(f) {
		return planWrite
	}
	var have, add int64
	if f != nil {
		have = f.bytes
	}
	for i := range ev.rows {
		add += freshCost(&ev.rows[i])
	}
	if have+wb.bytes+add <= s.opts.FreshSubscriptionBytes && s.fresh.used.Load()+wb.bytes+add <= s.fresh.limit {
		wb.bytes += add
		return planDefer
	}
	wb.durable = true
	return planSpill
}

// addMemoryOnly adds to b what sub holds only in memory, in push order:
// its fresh rows above the GC target (unless all written; held counts
// them), then the rows of its pushes in earlier that apply deferred in
// this batch and now writes at their commit after all (their deferred
// mark is cleared; moved counts them). Called by sub's write worker,
// before the rows of a push that did not fit.
func (s *Store) addMemoryOnly(b *pebble.Batch, sub *subscription, earlier []writeEvent) (held, moved rowCount, err error) {
	sub.mu.Lock()
	if f := sub.mu.fresh; f != nil && !f.allWritten {
		held.rows, held.bytes, err = addRowsAbove(b, sub.id, f.rows, sub.mu.gcTarget)
	}
	sub.mu.Unlock()
	if err != nil {
		return held, moved, err
	}
	for i := range earlier {
		ev := &earlier[i]
		if ev.sub != sub || !ev.deferred {
			continue
		}
		n, k, err := addRowsAbove(b, sub.id, ev.rows, 0)
		if err != nil {
			return held, moved, err
		}
		ev.deferred = false
		moved.rows, moved.bytes = moved.rows+n, moved.bytes+k
	}
	return held, moved, nil
}

// rowCount is a number of rows and their encoded bytes.
type rowCount struct{ rows, bytes int }

// markAllWritten records, once the batch that wrote what sub held only in
// memory committed, that its fresh rows are all in pebble. Nothing was
// appended to them since addMemoryOnly: only the write worker appends,
// when it publishes, after this.
func (s *Store) markAllWritten(sub *subscription) {
	sub.mu.Lock()
	if f := sub.mu.fresh; f != nil {
		f.allWritten = true
	}
	sub.mu.pebbleMax = max(sub.mu.pebbleMax, sub.mu.maxCommit) // the rows held were committed before
	sub.mu.Unlock()
}

// leaveWriteBehindLocked writes what sub holds only in memory to pebble
// (its fresh rows unless all written and, if deferred, rows) before from
// moves above the GC target; false if that failed (nothing may leave
// memory then). REQUIRES: sub.mu held.
func (s *Store) leaveWriteBehindLocked(sub *subscription, f *freshRows, rows []common.Row, deferred bool) bool {
	if !sub.writeBehindLocked(f) {
		return true // everything above the GC target is in pebble already
	}
	var held, extra []common.Row
	if !f.allWritten {
		held = f.rows
	}
	if deferred || len(held) > 0 {
		// A push written at its commit goes again after what was held:
		// only after a failed spill can both be here, and the push's
		// rows are the later versions.
		extra = rows
	}
	if s.spillLocked(sub, held, extra) != nil {
		return false
	}
	f.allWritten = true
	return true
}

// spillLocked writes the rows above sub's GC target of each set to pebble
// in one batch, in order, logging a failure. REQUIRES: sub.mu held (the
// write worker's: it runs beside apply's batches, not inside one).
func (s *Store) spillLocked(sub *subscription, sets ...[]common.Row) error {
	b := s.db.NewBatch()
	defer func() { _ = b.Close() }()
	rows, bytes := 0, 0
	for _, set := range sets {
		n, k, err := addRowsAbove(b, sub.id, set, sub.mu.gcTarget)
		if err != nil {
			s.log.Error("rows held in memory only not written", zap.Uint64("sub", sub.id), zap.Error(err))
			return err
		}
		rows, bytes = rows+n, bytes+k
	}
	if rows == 0 {
		return nil
	}
	if err := b.Commit(pebble.NoSync); err != nil {
		s.log.Error("rows held in memory only not written", zap.Uint64("sub", sub.id), zap.Error(err))
		return fmt.Errorf("eventstore: commit: %w", err)
	}
	s.countSpilled(rows, bytes)
	sub.mu.pebbleMax = max(sub.mu.pebbleMax, sub.mu.maxCommit) // maxCommit counts the push being published
	return nil
}

// countSpilled counts rows written to pebble after their commit.
func (s *Store) countSpilled(rows, bytes int) {
	s.metrics.rowsWritten.Add(float64(rows))
	s.metrics.bytesWritten.Add(float64(bytes))
	s.metrics.rowsSpilled.Add(float64(rows))
	s.metrics.bytesSpilled.Add(float64(bytes))
}

// addRowsAbove adds the rows of subscription id with commit-ts above
// floor to b and returns how many and their encoded bytes.
func addRowsAbove(b *pebble.Batch, id uint64, rows []common.Row, floor common.Ts) (n, bytes int, err error) {
	for j := range rows {
		r := &rows[j]
		if r.CommitTs <= floor {
			continue // below every range a scan may ask for
		}
		kl, vl := encodedKeyLen(r.Key), encodedValueLen(r)
		op := b.SetDeferred(kl, vl)
		encodeKey(op.Key, id, r.CommitTs, r.StartTs, r.Key)
		encodeValue(op.Value, r)
		if err := op.Finish(); err != nil {
			return 0, 0, fmt.Errorf("eventstore: encode row: %w", err)
		}
		n, bytes = n+1, bytes+kl+vl
	}
	return n, bytes, nil
}

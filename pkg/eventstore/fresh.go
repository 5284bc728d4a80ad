package eventstore

import (
	"bytes"
	"slices"
	"sync/atomic"

	"github.com/cdcflow/eventservice/pkg/common"
)

// freshRows is a subscription's most recently committed rows, kept in memory
// beside pebble so that the scan of a dispatcher that keeps up is served
// without a pebble iterator. With many tables each scan finds a row or two,
// and opening an iterator and seeking it down the memtable's skiplist
// costs far more than reading them.
//
// INVARIANT (under subscription.mu): every committed row of the
// subscription with commit-ts > from is in rows. rows is in the order the
// write worker committed them, which need not be key order (a transaction's
// rows arrive in the upstream's order); a later row with the same
// (commit-ts, start-ts, key) replaces an earlier one, as pebble's Set does.
// Rows at or below from may or may not be there. A scan whose range starts
// at or above from is therefore answered from rows alone, exactly as pebble
// would answer it; any other scan goes to pebble.
//
// Memory is bounded twice: a subscription keeps at most
// Options.FreshSubscriptionBytes (the oldest transactions are dropped, and
// from moves up to the newest dropped commit-ts), and all subscriptions
// together at most Options.FreshBytes (a subscription that cannot reserve
// room drops what it holds and starts again above its newest row). A
// checkpoint drops what no dispatcher can scan again.
type freshRows struct {
	from  common.Ts
	rows  []common.Row
	bytes int64
	// unordered: some row has a smaller commit-ts than one before it (an
	// upstream that pushes commits out of order), so a scan looks at every
	// row; otherwise it binary-searches its start.
	unordered bool
	// allWritten: every row in rows above the GC target is in pebble too
	// (none of them is held in memory only: see writebehind.go). True
	// while rows is empty.
	allWritten bool
}

// freshLocked returns sub's fresh rows, made at its first committed row:
// until then sub.mu.fresh is nil, which means no row was ever committed (an
// idle subscription pays a pointer). REQUIRES: sub.mu held.
func (sub *subscription) freshLocked() *freshRows {
	if sub.mu.fresh == nil {
		sub.mu.fresh = &freshRows{from: sub.startTs, allWritten: true}
	}
	return sub.mu.fresh
}

// freshBudget is the store-wide account of fresh rows' bytes.
type freshBudget struct {
	limit int64 // Options.FreshBytes; <= 0: no fresh rows at all
	used  atomic.Int64
}

func (b *freshBudget) reserve(n int64) bool {
	if b.used.Add(n) <= b.limit {
		return true
	}
	b.used.Add(-n)
	return false
}

func (b *freshBudget) release(n int64) { b.used.Add(-n) }

// freshRowOverhead approximates what a kept row costs besides its payload:
// the Row struct and the slice headers' share of their arrays.
const freshRowOverhead = 96

func freshCost(r *common.Row) int64 { return int64(r.Size()) + freshRowOverhead }

// keepFreshLocked adds the rows of a committed batch; deferred says apply
// kept them out of pebble (planRows). It reports false if rows held only
// in memory could not be written to pebble before they had to be (the
// caller then leaves resolved-ts where it was, as for a failed commit).
// REQUIRES: sub.mu held, and sub.mu.maxCommit already counting rows.
func (s *Store) keepFreshLocked(sub *subscription, rows []common.Row, deferred bool) bool {
	if s.fresh.limit <= 0 || len(rows) == 0 {
		return true
	}
	limit := s.opts.FreshSubscriptionBytes
	f := sub.freshLocked()
	if deferred && !sub.mu.removed && !sub.writeBehindLocked(f) {
		// The floor moved above the checkpoints since apply deferred the
		// rows (the store's budget ran out for an earlier push of the
		// batch): a pebble scan may ask for them.
		if err := s.spillLocked(sub, rows); err != nil {
			s.keepAllLocked(f, rows, true)
			return false
		}
		deferred = false
	}
	add := freshCostAbove(f, rows)
	switch {
	case add == 0:
		return true
	case sub.mu.removed:
		s.dropFreshLocked(sub)
		return true
	case add > limit:
		if !s.leaveWriteBehindLocked(sub, f, rows, deferred) {
			s.keepAllLocked(f, rows, deferred)
			return false
		}
		s.dropFreshLocked(sub)
		return true
	}
	if over := f.bytes + add - limit; over > 0 {
		if !s.leaveWriteBehindLocked(sub, f, rows, deferred) {
			s.keepAllLocked(f, rows, deferred)
			return false
		}
		// Free at least half the allowance, so that a subscription at its
		// cap does not pay a compaction per batch.
		s.evictFreshLocked(sub, max(over, limit/2))
		add = freshCostAbove(f, rows) // from moved up
		deferred = false              // written by the spill
	}
	if !s.fresh.reserve(add) {
		if !s.leaveWriteBehindLocked(sub, f, rows, deferred) {
			s.keepAllLocked(f, rows, deferred)
			return false
		}
		s.dropFreshLocked(sub)
		s.metrics.freshDropped.Inc()
		return true
	}
	s.appendFreshLocked(f, rows, add, deferred)
	return true
}

// appendFreshLocked appends the rows above from, which cost add (already
// reserved); memOnly: they are not in pebble. REQUIRES: sub.mu held.
func (s *Store) appendFreshLocked(f *freshRows, rows []common.Row, add int64, memOnly bool) {
	for i := range rows {
		if rows[i].CommitTs > f.from {
			if n := len(f.rows); n > 0 && rows[i].CommitTs < f.rows[n-1].CommitTs {
				f.unordered = true
			}
			f.rows = append(f.rows, rows[i])
			f.allWritten = f.allWritten && !memOnly
		}
	}
	f.bytes += add
}

// keepAllLocked keeps rows past the budgets: rows held only here could not
// be written to pebble, and dropping them would lose them (the store logged
// the failure). REQUIRES: sub.mu held.
func (s *Store) keepAllLocked(f *freshRows, rows []common.Row, memOnly bool) {
	add := freshCostAbove(f, rows)
	s.fresh.used.Add(add)
	s.appendFreshLocked(f, rows, add, memOnly)
}

// freshCostAbove is what keeping the rows above f's from would cost.
func freshCostAbove(f *freshRows, rows []common.Row) int64 {
	var n int64
	for i := range rows {
		if rows[i].CommitTs > f.from {
			n += freshCost(&rows[i])
		}
	}
	return n
}

// evictFreshLocked drops the oldest transactions until at least need bytes
// are free, moving from up to the newest commit-ts dropped. REQUIRES:
// sub.mu held.
func (s *Store) evictFreshLocked(sub *subscription, need int64) {
	f := sub.mu.fresh
	var freed int64
	upTo := f.from
	for i := range f.rows {
		if freed >= need {
			break
		}
		freed += freshCost(&f.rows[i])
		upTo = max(upTo, f.rows[i].CommitTs)
	}
	s.trimFreshLocked(sub, upTo)
}

// trimFreshLocked drops every row at or below ts and moves from to ts: rows
// a scan can no longer ask for (below every dispatcher's checkpoint) or
// that are evicted. REQUIRES: sub.mu held.
func (s *Store) trimFreshLocked(sub *subscription, ts common.Ts) {
	f := sub.mu.fresh
	if f == nil || ts <= f.from {
		return
	}
	f.from = ts
	kept := f.rows[:0]
	var freed int64
	for i := range f.rows {
		if f.rows[i].CommitTs > ts {
			kept = append(kept, f.rows[i])
		} else {
			freed += freshCost(&f.rows[i])
		}
	}
	clear(f.rows[len(kept):]) // drop the references for the GC
	f.rows = kept
	if len(kept) == 0 {
		f.rows = nil // give the array back: an idle table holds nothing
		f.unordered, f.allWritten = false, true
	}
	f.bytes -= freed
	s.fresh.release(freed)
}

// dropFreshLocked drops every row and moves from to the newest committed
// commit-ts, above which rows are kept again. REQUIRES: sub.mu held.
func (s *Store) dropFreshLocked(sub *subscription) {
	f := sub.mu.fresh
	if f == nil {
		return // nothing was ever committed
	}
	clear(f.rows)
	f.rows, f.unordered, f.allWritten = nil, false, true
	s.fresh.release(f.bytes)
	f.bytes = 0
	f.from = max(f.from, sub.mu.maxCommit)
}

// freshScanLocked returns the rows of r in iteration order, and whether
// the fresh rows cover r (otherwise the scan goes to pebble). The rows are
// a copy of the Row values; their byte slices are shared and immutable.
// REQUIRES: sub.mu held.
func (s *Store) freshScanLocked(sub *subscription, r ScanRange) ([]common.Row, bool) {
	if s.fresh.limit <= 0 {
		return nil, false
	}
	f := sub.mu.fresh
	if f == nil {
		return nil, true // nothing committed: the range is empty
	}
	if r.Start < f.from {
		return nil, false
	}
	first, end := 0, len(f.rows)
	var out []common.Row
	if !f.unordered {
		byCommit := func(row common.Row, ts common.Ts) int { return cmpTs(row.CommitTs, ts) }
		first, _ = slices.BinarySearchFunc(f.rows, r.Start+1, byCommit)
		end, _ = slices.BinarySearchFunc(f.rows, r.End+1, byCommit)
		out = make([]common.Row, 0, end-first)
	}
	for i := first; i < end; i++ {
		row := &f.rows[i]
		if row.CommitTs <= r.Start || row.CommitTs > r.End || (r.After != nil && !afterCursor(row, r.After)) {
			continue
		}
		out = append(out, *row)
	}
	// Stable, so that of two rows with one key the later one is last.
	slices.SortStableFunc(out, func(a, b common.Row) int { return compareRowKeys(&a, &b) })
	// Keep the last of each run of equal keys, as pebble's Set would.
	n := 0
	for i := range out {
		if n > 0 && compareRowKeys(&out[n-1], &out[i]) == 0 {
			out[n-1] = out[i]
			continue
		}
		out[n] = out[i]
		n++
	}
	return out[:n], true
}

// compareRowKeys orders rows as their pebble keys are ordered: commit-ts,
// start-ts, then the row key's bytes.
func compareRowKeys(a, b *common.Row) int {
	switch {
	case a.CommitTs != b.CommitTs:
		return cmpTs(a.CommitTs, b.CommitTs)
	case a.StartTs != b.StartTs:
		return cmpTs(a.StartTs, b.StartTs)
	}
	return bytes.Compare(a.Key, b.Key)
}

func cmpTs(a, b common.Ts) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// afterCursor reports whether row sorts strictly after c, as the lower
// bound NewIterator derives from c does.
func afterCursor(row *common.Row, c *Cursor) bool {
	if row.CommitTs != c.CommitTs {
		return row.CommitTs > c.CommitTs
	}
	if c.Key == nil {
		return row.StartTs > c.StartTs
	}
	if row.StartTs != c.StartTs {
		return row.StartTs > c.StartTs
	}
	return bytes.Compare(row.Key, c.Key) > 0
}

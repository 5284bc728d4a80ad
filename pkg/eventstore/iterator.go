package eventstore

import (
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/cdcflow/eventservice/pkg/common"
)

// Cursor is a position inside a scan range to resume strictly after. With a
// nil Key it names a whole transaction (CommitTs, StartTs): the scan resumes
// at the next transaction. With a Key it names one row, for a transaction
// that was split: the scan resumes at the next row.
type Cursor struct {
	CommitTs common.Ts
	StartTs  common.Ts
	Key      []byte
}

// ScanRange selects the rows with commit-ts in (Start, End], resuming
// strictly after After when it is set.
type ScanRange struct {
	Start, End common.Ts
	After      *Cursor
}

// RowIterator is what a scan reads: the rows of one dispatcher's range in
// commit-ts, start-ts, row-key order. NewIterator returns the store's
// (*Iterator); a test store may return its own. Row's byte slices are valid
// until the next Next or Close; Close is idempotent and must be called.
type RowIterator interface {
	Next() bool
	Row() *common.Row
	NewTxn() bool
	Err() error
	Close() error
}

var _ RowIterator = (*Iterator)(nil)

// Iterator yields the rows of one dispatcher's span in commit-ts, start-ts,
// row-key order. It is not safe for concurrent use. Close it before the
// store is closed.
type Iterator struct {
	s  *Store
	it *pebble.Iterator // nil when the scan is served from fresh rows
	// fresh holds the range's rows in order when it is served from the
	// subscription's fresh rows (next is the index of the next one).
	fresh  []common.Row
	next   int
	row    common.Row
	newTxn bool
	began  bool
	closed bool
	err    error
}

// NewIterator returns an iterator over r for dispatcher id. A range that
// starts below the dispatcher's checkpoint (data may be collected) or ends
// above the subscription's committed resolved-ts (data may be incomplete)
// is refused with ErrRangeBelowCheckpoint or ErrRangeAboveResolved.
func (s *Store) NewIterator(id common.DispatcherID, r ScanRange) (RowIterator, error) {
	if r.Start > r.End {
		return nil, fmt.Errorf("%w: start %v after end %v", ErrInvalidRange, r.Start, r.End)
	}
	if c := r.After; c != nil && (c.CommitTs <= r.Start || c.CommitTs > r.End) {
		return nil, fmt.Errorf("%w: cursor commit-ts %v outside (%v, %v]", ErrInvalidRange, c.CommitTs, r.Start, r.End)
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mu.closed {
		return nil, ErrClosed
	}
	sb, ok := s.mu.dispatchers.Lookup(id)
	if !ok {
		return nil, fmt.Errorf("%w: %v", ErrDispatcherNotFound, id)
	}
	sub := sb.sub
	sub.mu.Lock()
	checkpoint, resolved := sb.checkpoint, sub.mu.resolved
	if r.Start < checkpoint {
		sub.mu.Unlock()
		return nil, fmt.Errorf("%w: start %v, checkpoint %v", ErrRangeBelowCheckpoint, r.Start, checkpoint)
	}
	if r.End > resolved {
		sub.mu.Unlock()
		return nil, fmt.Errorf("%w: end %v, resolved-ts %v", ErrRangeAboveResolved, r.End, resolved)
	}
	rows, fresh := s.freshScanLocked(sub, r)
	sub.mu.Unlock()
	if fresh {
		s.metrics.scansFresh.Inc()
		s.openIters.Add(1)
		return &Iterator{s: s, fresh: rows}, nil
	}
	s.metrics.scansPebble.Inc()
	lower := tsBoundary(sub.id, r.Start+1)
	if c := r.After; c != nil {
		if c.Key == nil {
			lower = appendKey(nil, sub.id, c.CommitTs, c.StartTs+1, nil)
		} else {
			lower = append(appendKey(nil, sub.id, c.CommitTs, c.StartTs, c.Key), 0)
		}
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: tsBoundary(sub.id, r.End+1)})
	if err != nil {
		return nil, fmt.Errorf("eventstore: new iterator: %w", err)
	}
	s.openIters.Add(1)
	return &Iterator{s: s, it: it}, nil
}

// Next advances to the next row and reports whether there is one.
func (it *Iterator) Next() bool {
	if it.err != nil || it.closed {
		return false
	}
	if it.it == nil {
		return it.nextFresh()
	}
	var ok bool
	if !it.began {
		it.began = true
		ok = it.it.First()
	} else {
		ok = it.it.Next()
	}
	if !ok {
		it.err = it.it.Error()
		return false
	}
	_, commitTs, startTs, key, err := decodeKey(it.it.Key())
	if err != nil {
		it.err = err
		return false
	}
	it.newTxn = commitTs != it.row.CommitTs || startTs != it.row.StartTs
	it.row.CommitTs, it.row.StartTs, it.row.Key = commitTs, startTs, key
	v, err := it.it.ValueAndErr()
	if err == nil {
		err = decodeValue(v, &it.row)
	}
	if err != nil {
		it.err = err
		return false
	}
	return true
}

// nextFresh is Next over fresh rows.
func (it *Iterator) nextFresh() bool {
	if it.next >= len(it.fresh) {
		return false
	}
	r := &it.fresh[it.next]
	it.next++
	it.newTxn = !it.began || r.CommitTs != it.row.CommitTs || r.StartTs != it.row.StartTs
	it.began = true
	it.row = *r
	return true
}

// Row returns the current row. Its byte slices are only valid until the
// next call to Next or Close; Clone the row to keep it.
func (it *Iterator) Row() *common.Row { return &it.row }

// NewTxn reports whether the current row starts a transaction: it is the
// first row, or its (commit-ts, start-ts) differs from the previous row's.
func (it *Iterator) NewTxn() bool { return it.newTxn }

// Err returns the error that stopped iteration, if any.
func (it *Iterator) Err() error { return it.err }

// Close releases the iterator. It is idempotent.
func (it *Iterator) Close() error {
	if it.closed {
		return nil
	}
	it.closed = true
	it.s.openIters.Add(-1)
	if it.it == nil {
		it.fresh = nil
		return nil
	}
	return it.it.Close()
}

package pebblesink

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// Reading the sink back: checkpoints, DDLs and row versions.

// CheckpointOf returns the persisted checkpoint of id, or 0: the highest
// one, since checkpoints only go up (a dispatcher added again from below
// it must resume from max(its start-ts, this), as cdcserver does).
func (s *Sink) CheckpointOf(id common.DispatcherID) (common.Ts, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.mu.dispatchers[id]; st != nil {
		return st.checkpoint, nil
	}
	return 0, nil
}

// DDLs returns the stored DDLs of table in commit-ts order.
func (s *Sink) DDLs(table int64) ([]messaging.DDL, error) {
	var out []messaging.DDL
	err := s.scanTable('d', table, func(k, v []byte) error {
		if len(k) != 8 {
			return fmt.Errorf("%w: DDL key of table %d has %d bytes after the table, want 8", ErrCorruptSink, table, len(k))
		}
		out = append(out, messaging.DDL{TableID: table, CommitTs: common.Ts(binary.BigEndian.Uint64(k)), Query: string(v)})
		return nil
	})
	return out, err
}

// tableBounds is the key range [lo, hi) of table's entries under the
// one-byte prefix kind: lo is kind | table(8), and hi the smallest key
// above every key lo prefixes (prefixSuccessor), not kind | table+1,
// which wraps to kind | 0 for table -1 and would make an inverted range.
// A negative table is refused: none exists, and its range sorts after
// every other table's, so letting it through would hide a caller's bug.
func tableBounds(kind byte, table int64) (lo, hi []byte, err error) {
	if table < 0 {
		return nil, nil, fmt.Errorf("durable sink: %w %d", ErrInvalidTable, table)
	}
	lo = binary.BigEndian.AppendUint64([]byte{kind}, uint64(table))
	return lo, prefixSuccessor(lo), nil
}

// prefixSuccessor returns the smallest key greater than every key with
// prefix p, or nil (no upper bound) when p is all 0xFF.
func prefixSuccessor(p []byte) []byte {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] != 0xFF {
			out := bytes.Clone(p[:i+1])
			out[i]++
			return out
		}
	}
	return nil
}

// scanTable calls fn, in key order, with every entry of table under the
// one-byte prefix kind: its key after the prefix and table, and its value
// (both valid only during the call). fn's error stops the scan.
func (s *Sink) scanTable(kind byte, table int64, fn func(k, v []byte) error) error {
	lo, hi, err := tableBounds(kind, table)
	if err != nil {
		return err
	}
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		v, err := it.ValueAndErr()
		if err != nil {
			return err
		}
		if err := fn(it.Key()[len(lo):], v); err != nil {
			return err
		}
	}
	return it.Error()
}

// decodeVersion decodes a version entry: k after the prefix and table.
func decodeVersion(k, v []byte) (Version, error) {
	key, rest, err := decodeEscaped(k)
	if err != nil {
		return Version{}, err
	}
	if len(rest) != 8 {
		return Version{}, fmt.Errorf("%w: version key of %x ends with %d bytes, want a commit-ts of 8", ErrCorruptSink, key, len(rest))
	}
	if len(v) < 9 {
		return Version{}, fmt.Errorf("%w: version value of %x has %d bytes, want at least 9", ErrCorruptSink, key, len(v))
	}
	return Version{Key: key, CommitTs: common.Ts(binary.BigEndian.Uint64(rest)), Seq: binary.BigEndian.Uint64(v),
		Op: common.OpType(v[8]), Value: bytes.Clone(v[9:])}, nil
}

// Version is one stored row version.
type Version struct {
	Key      []byte
	CommitTs common.Ts
	Seq      uint64
	Op       common.OpType
	Value    []byte
}

// Versions returns the stored versions of table, ordered by key then
// commit-ts (the escaped layout makes that the scan's order).
func (s *Sink) Versions(table int64) ([]Version, error) {
	var out []Version
	err := s.scanTable('v', table, func(k, v []byte) error {
		ver, err := decodeVersion(k, v)
		if err != nil {
			return fmt.Errorf("table %d: %w", table, err)
		}
		out = append(out, ver)
		return nil
	})
	return out, err
}

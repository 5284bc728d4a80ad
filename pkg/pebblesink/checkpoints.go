package pebblesink

import (
	"encoding/binary"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/cdcflow/eventservice/pkg/common"
)

// The checkpoints are a log and its snapshot, not a key per dispatcher:
//
//	k | n(8)      -> (dispatcher(16) | ts(8))...   one batch's checkpoints, n counting up
//	C | chunk(4)  -> (dispatcher(16) | ts(8))...   every checkpoint when the log was last cut
//
// A batch's checkpoints are one log entry, in the batch that writes their
// rows, so rows and checkpoint still commit together. A key per dispatcher,
// rewritten at every checkpoint, was a memtable insert per checkpoint into
// a skiplist of every checkpoint written since the last flush. Once the log
// holds twice as many checkpoints as there are dispatchers (and at least
// logCutMin), one batch writes the snapshot and deletes the log it
// replaces, so a crash leaves the one or the other. Open reads the
// snapshot, then the log in order; CheckpointOf answers from memory
// (dispatcherState.checkpoint).
type checkpointLog struct {
	next    uint64 // the next log entry's n
	entries int    // checkpoints in the log
	batch   []byte // the entry being built
}

const (
	checkpointEntryBytes = 16 + 8
	// snapshotChunk is how many checkpoints one snapshot key holds.
	snapshotChunk = 4096
	// logCutMin: the log is not cut below this many checkpoints.
	logCutMin = 64 << 10
)

func logKey(n uint64) []byte { return binary.BigEndian.AppendUint64([]byte{'k'}, n) }

func snapshotKey(chunk uint32) []byte { return binary.BigEndian.AppendUint32([]byte{'C'}, chunk) }

// add appends id's checkpoint ts to the entry being built.
func (l *checkpointLog) add(id common.DispatcherID, ts common.Ts) {
	b := id.Bytes()
	l.batch = append(l.batch, b[:]...)
	l.batch = binary.BigEndian.AppendUint64(l.batch, uint64(ts))
}

// write puts the entry being built, if any, into b.
func (l *checkpointLog) write(b *pebble.Batch) error {
	if len(l.batch) == 0 {
		return nil
	}
	return b.Set(logKey(l.next), l.batch, nil)
}

// committed records that the entry write put into a batch, of n
// checkpoints, is committed.
func (l *checkpointLog) committed(n int) {
	if len(l.batch) == 0 {
		return
	}
	l.entries += n
	l.next++
	l.batch = l.batch[:0]
}

// dueForCut reports whether the log should be replaced by a snapshot, for
// a sink of about dispatchers checkpoints.
func (l *checkpointLog) dueForCut(dispatchers int) bool {
	return l.entries >= max(2*dispatchers, logCutMin)
}

// cut writes every checkpoint (each calls fn with them) as the snapshot
// and deletes the log, in one batch.
func (l *checkpointLog) cut(db *pebble.DB, each func(fn func(common.DispatcherID, common.Ts))) error {
	b := db.NewBatch()
	defer b.Close()
	if err := b.DeleteRange([]byte{'C'}, []byte{'C' + 1}, nil); err != nil {
		return err
	}
	if err := b.DeleteRange(logKey(0), logKey(l.next), nil); err != nil {
		return err
	}
	var chunk []byte
	n := uint32(0)
	flush := func() error {
		if len(chunk) == 0 {
			return nil
		}
		err := b.Set(snapshotKey(n), chunk, nil)
		chunk, n = chunk[:0], n+1
		return err
	}
	var err error
	each(func(id common.DispatcherID, ts common.Ts) {
		idb := id.Bytes()
		chunk = append(chunk, idb[:]...)
		chunk = binary.BigEndian.AppendUint64(chunk, uint64(ts))
		if len(chunk) == snapshotChunk*checkpointEntryBytes && err == nil {
			err = flush()
		}
	})
	if err != nil {
		return err
	}
	if err := flush(); err != nil {
		return err
	}
	if err := b.Commit(pebble.NoSync); err != nil {
		return err
	}
	l.entries = 0
	return nil
}

// load reads the snapshot, then the log in order, calling set with each
// checkpoint.
func (l *checkpointLog) load(db *pebble.DB, set func(common.DispatcherID, common.Ts)) error {
	for _, kind := range []byte{'C', 'k'} {
		it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{kind}, UpperBound: []byte{kind + 1}})
		if err != nil {
			return err
		}
		for ok := it.First(); ok; ok = it.Next() {
			k := it.Key()
			v, err := it.ValueAndErr()
			if err == nil {
				err = decodeCheckpointEntry(k, v, set)
			}
			if err != nil {
				_ = it.Close()
				return err
			}
			if kind == 'k' {
				l.entries += len(v) / checkpointEntryBytes
				l.next = binary.BigEndian.Uint64(k[1:]) + 1
			}
		}
		if err := it.Close(); err != nil {
			return err
		}
	}
	return nil
}

// decodeCheckpointEntry checks a log entry or snapshot chunk (key k, value
// v) and calls set with each of its checkpoints; one that is not whole
// (dispatcher, ts) pairs under a key of its kind is ErrCorruptSink, and
// set is not called. FuzzDecodeCheckpointEntry.
func decodeCheckpointEntry(k, v []byte, set func(common.DispatcherID, common.Ts)) error {
	wantKey := 0
	if len(k) > 0 {
		switch k[0] {
		case 'k':
			wantKey = 1 + 8
		case 'C':
			wantKey = 1 + 4
		}
	}
	if wantKey == 0 || len(k) != wantKey || len(v)%checkpointEntryBytes != 0 {
		return fmt.Errorf("%w: checkpoint entry %x of %d bytes", ErrCorruptSink, k, len(v))
	}
	forEachCheckpoint(v, set)
	return nil
}

// forEachCheckpoint calls fn with each (dispatcher, ts) of an entry.
// REQUIRES: len(b) is a multiple of checkpointEntryBytes.
func forEachCheckpoint(b []byte, fn func(common.DispatcherID, common.Ts)) {
	for ; len(b) >= checkpointEntryBytes; b = b[checkpointEntryBytes:] {
		id := common.DispatcherID{Hi: binary.BigEndian.Uint64(b), Lo: binary.BigEndian.Uint64(b[8:])}
		fn(id, common.Ts(binary.BigEndian.Uint64(b[16:])))
	}
}

package pebblesink

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/sstable"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventcollector"
)

// Sink is the downstream of cdcserver's crash and restart runs: a pebble
// database that, like a real downstream database, applies row versions
// idempotently by (table, key, commit-ts) and persists each dispatcher's
// rows together with its checkpoint in one atomic batch. After a crash the
// server reads the checkpoints back and resumes every dispatcher from its
// own.
//
// Layout (table is a non-negative int64, big-endian):
//
//	v | table(8) | esc(key) | commitTs(8)  -> seq(8) | op(1) | value   (one row version)
//	d | table(8) | commitTs(8)             -> query                    (one DDL)
//	k | n(8)                               -> (dispatcher(16) | ts(8))... (a batch's checkpoints: checkpoints.go)
//	C | chunk(4)                           -> (dispatcher(16) | ts(8))... (a snapshot of them)
//	m | table(8)                           -> commitTs(8)              (the table's newest version)
//	s                                      -> next seq(8)
//	f                                      -> format(1)
//
// esc(key) is the key with every 0x00 written as 0x00 0xFF, ended by
// 0x00 0x01 (appendEscaped). A raw key would not delimit itself: key "a"
// followed by its commit-ts bytes sorts after key "a\x00" or "ab" at one
// commit-ts and before it at another, so one key's versions were not
// contiguous and the verifier's per-key order check, which compares
// neighbours, could miss a violation. The escaped form is order-preserving
// (bytes.Compare of two escaped keys is that of the keys) and prefix-free,
// so a table's versions come out of one scan ordered by key, then
// commit-ts. f records that layout (sinkFormat); a sink of the earlier raw
// layout is refused (ErrSinkFormat), not misread.
//
// seq numbers versions in the order they were first applied, so the
// verifier can check per-key order across restarts: for every key, a
// version with a higher commit-ts must have been applied later.
//
// m is the highest commit-ts of any version of the table, written in the
// batch that writes the version. Only a row at or below it can be a
// re-delivery, so only those are looked up (the lookup, one per row, was
// the durable sink's cost: issue 22); a row above it is new, except for a
// repeat of a row earlier in the same batch, which the batch's own index
// of its transaction's keys catches.
type Sink struct {
	db *pebble.DB

	mu struct {
		sync.Mutex
		nextSeq     uint64
		applied     uint64
		dispatchers map[common.DispatcherID]*dispatcherState
		tables      map[int64]*tableState
		// batches numbers CheckpointBatch's calls (tableState.stagedIn).
		batches uint64
		// group is Checkpoint's scratch: the keys of the rows above m
		// at the current commit-ts; key a version key being built;
		// states, the state of each entry of the batch being written.
		group  keyGroup
		key    []byte
		states []*dispatcherState
		// cps is the checkpoints' log.
		cps checkpointLog
		// inBatch finds the versions the batch being written holds.
		inBatch batchKeys
		// lastBatch is the size the last committed batch was made at
		// and what it held (TestACheckpointBatchIsMadeAtItsSize).
		lastBatch struct{ made, held int }
	}
}

var _ eventcollector.Sink = (*Sink)(nil)

// sinkCacheBytes is the durable sink's block cache; sinkMemTableBytes its
// largest memtable.
const (
	sinkCacheBytes    = 64 << 20
	sinkMemTableBytes = 64 << 20
	// L0 is compacted at this many files and stops writes at that many;
	// Lbase holds this much.
	sinkL0CompactionFiles = 8
	sinkL0StopWritesFiles = 32
	sinkLBaseBytes        = 256 << 20
	// sinkBlockBytes is the tables' block size: pebble writes a table a
	// block per write(2), and with its 4 KiB default flushes and
	// compactions were a system call per 4 KiB. Lookups read a block only
	// for the rare key their bloom filter does not rule out.
	sinkBlockBytes = 64 << 10
)

// Open opens (or creates) the sink in dir.
func Open(dir string) (*Sink, error) {
	// Each row is looked up before it is written (a re-delivery must keep
	// its first application's sequence number), and nearly all lookups
	// miss: bloom filters answer those without reading the tables' index
	// blocks.
	//
	// The memtable is the event store's 64 MiB, not pebble's 4 MiB: with
	// 4 MiB a collector process taking 100k rows/s flushed several
	// memtables a second and spent its CPU compacting them. Pebble starts
	// with small memtables and doubles them up to this size, so a sink
	// that takes little holds little.
	//
	// The sink is written far more than it is read: its reads are those
	// lookups and the verifier's scans at the end. So L0 takes more files
	// before it is compacted, and Lbase more bytes, than pebble's defaults
	// (4 files, 64 MiB), which rewrite every byte more times on a keyspace
	// that each memtable covers end to end (a table's rows have random
	// keys). And blocks are not compressed: the values are the generator's
	// pseudo-random bytes, which snappy spends CPU on and cannot shrink.
	cache := pebble.NewCache(sinkCacheBytes)
	defer cache.Unref() // the DB holds its own reference
	opts := &pebble.Options{Logger: quietPebble{}, Cache: cache, MemTableSize: sinkMemTableBytes,
		L0CompactionThreshold: sinkL0CompactionFiles, L0StopWritesThreshold: sinkL0StopWritesFiles, LBaseMaxBytes: sinkLBaseBytes}
	for i := range opts.Levels {
		opts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
		opts.Levels[i].BlockSize = sinkBlockBytes
		opts.Levels[i].Compression = func() *sstable.CompressionProfile { return sstable.NoCompression }
	}
	db, err := pebble.Open(dir, opts)
	if err != nil {
		return nil, fmt.Errorf("open durable sink: %w", err)
	}
	s := &Sink{db: db}
	s.mu.dispatchers = map[common.DispatcherID]*dispatcherState{}
	s.mu.tables = map[int64]*tableState{}
	if err := s.load(); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open durable sink %s: %w", dir, err)
	}
	return s, nil
}

// sinkFormat is the layout above: 4, with the checkpoints in a log (3 had
// a key per dispatcher; 2 no m, so its tables' newest versions are
// unknown; 1, never written down, had raw keys).
const sinkFormat = 4

// load reads the next sequence number and checks the format marker,
// writing it into a sink that holds nothing yet.
func (s *Sink) load() error {
	seq, err := s.getUint64([]byte("s"))
	if err != nil {
		return err
	}
	f, closer, err := s.db.Get([]byte("f"))
	switch {
	case err == nil:
		defer closer.Close()
		if len(f) != 1 || f[0] != sinkFormat {
			return fmt.Errorf("%w: format %x, this version reads %d; use a fresh --data-dir", ErrSinkFormat, f, sinkFormat)
		}
	case !errors.Is(err, pebble.ErrNotFound):
		return err
	case seq != 0:
		// Versions were written, but not in this layout.
		return fmt.Errorf("%w: written with raw keys by an earlier version; use a fresh --data-dir", ErrSinkFormat)
	default:
		if err := s.db.Set([]byte("f"), []byte{sinkFormat}, pebble.Sync); err != nil {
			return err
		}
	}
	s.mu.nextSeq = max(seq, 1)
	return s.mu.cps.load(s.db, func(id common.DispatcherID, ts common.Ts) {
		st := s.stateLocked(id)
		st.checkpoint = max(st.checkpoint, ts)
	})
}

// getUint64 reads a big-endian uint64 value, 0 when the key is absent.
func (s *Sink) getUint64(key []byte) (uint64, error) {
	v, closer, err := s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer closer.Close()
	if len(v) != 8 {
		return 0, fmt.Errorf("%w: %q holds %d bytes, want 8", ErrCorruptSink, key, len(v))
	}
	return binary.BigEndian.Uint64(v), nil
}

// Close closes the database.
func (s *Sink) Close() error { return s.db.Close() }

// Bind tells the sink which table a dispatcher applies to.
func (s *Sink) Bind(id common.DispatcherID, table int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stateLocked(id).table = s.tableLocked(table)
}

// quietPebble drops pebble's informational logs.
type quietPebble struct{}

func (quietPebble) Infof(string, ...any)           {}
func (quietPebble) Errorf(string, ...any)          {}
func (quietPebble) Fatalf(format string, a ...any) { panic(fmt.Sprintf(format, a...)) }

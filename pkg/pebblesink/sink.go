package pebblesink

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/sstable"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventcollector"
	"github.com/cdcflow/eventservice/pkg/messaging"
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
	// compactions were a system call per 4 KiB (a fifth of a collector
	// process's CPU at 400k rows/s). Lookups read a block only for the
	// rare key their bloom filter does not rule out.
	sinkBlockBytes = 64 << 10
)

// Open opens (or creates) the sink in dir.
func Open(dir string) (*Sink, error) {
	// Each row is looked up before it is written (a re-delivery must keep
	// its first application's sequence number), and nearly all lookups
	// miss: bloom filters answer those without reading the tables' index
	// blocks, which without them was 80% of a collector process's CPU
	// at 4,000 dispatchers.
	//
	// The memtable is the event store's 64 MiB, not pebble's 4 MiB: a
	// collector process taking 100k rows/s flushed several memtables a
	// second, and compacting them was over half its CPU. The two-collector
	// run at 400k rows/s went from 132-144k to 171-181k rows/s (two runs
	// each, interleaved). Pebble starts with small memtables and doubles
	// them up to this size, so a sink that takes little holds little.
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

// Sentinel errors of the durable sink.
var (
	// ErrSinkFormat: the directory holds a sink of another layout.
	ErrSinkFormat = errors.New("durable sink of another format")
	// ErrCorruptSink: a stored key or value does not decode.
	ErrCorruptSink = errors.New("corrupt durable sink entry")
	// ErrInvalidTable: a negative table ID, which no span has
	// (common.Span.Validate) and whose key range this layout does not
	// order with the others'.
	ErrInvalidTable = errors.New("invalid table ID")
	// ErrNotBound: a checkpoint of a dispatcher Bind never named, whose
	// rows would have no table to go to.
	ErrNotBound = errors.New("dispatcher not bound to a table")
)

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

// BeginEpoch drops what was applied since the last checkpoint: the new
// epoch re-sends it.
func (s *Sink) BeginEpoch(id common.DispatcherID, _ uint64, _ common.Ts) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stateLocked(id).dropPending()
	return nil
}

// ApplyRows stages rows until the next checkpoint.
func (s *Sink) ApplyRows(id common.DispatcherID, rows []common.Row) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(rows) == 0 {
		return nil
	}
	st := s.stateLocked(id)
	// Kept without a copy, as the Sink contract allows; capped, so that
	// nothing appends into the caller's array past them.
	st.pending = append(st.pending, rows[:len(rows):len(rows)])
	st.pendingBytes += batchBytes(rows)
	return nil
}

// ApplyDDL stages a schema change until the next checkpoint, as rows are.
func (s *Sink) ApplyDDL(id common.DispatcherID, ddl *messaging.DDL) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stateLocked(id)
	st.ddls = append(st.ddls, *ddl)
	return nil
}

// Checkpoint writes the staged rows of id (skipping versions already
// present) and the checkpoint in one batch.
func (s *Sink) Checkpoint(id common.DispatcherID, ts common.Ts) error {
	errs := []error{nil}
	s.CheckpointBatch([]eventcollector.SinkCheckpoint{{ID: id, Ts: ts}}, errs)
	return errs[0]
}

var _ eventcollector.CheckpointBatcher = (*Sink)(nil)

// CheckpointBatch is Checkpoint of every entry, in one pebble batch and
// one commit: an entry of an unbound dispatcher fails alone; a batch that
// cannot be written or committed fails every entry it holds, and nothing
// of it is applied.
func (s *Sink) CheckpointBatch(cps []eventcollector.SinkCheckpoint, errs []error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// states[i] is cps[i]'s, found by one map probe here, and nil once
	// it failed alone. Found first so that the batch is made at its size.
	states := s.mu.states[:0]
	defer func() {
		clear(states)
		s.mu.states = states[:0]
	}()
	// Beside the rows: the log's entry of each checkpoint, the newest
	// commit-ts of a table that got rows (about 32 bytes each), the
	// sequence number and pebble's header (a few dozen in all); a DDL's,
	// rare, may grow the batch.
	size := 64 + len(cps)*checkpointEntryBytes
	for _, cp := range cps {
		st := s.mu.dispatchers[cp.ID]
		states = append(states, st)
		if st != nil && st.pendingBytes > 0 {
			size += st.pendingBytes + 32
		}
	}
	// A plain batch: the rare row that must be looked up is looked up in
	// the database and in s.mu.inBatch (batchkeys.go).
	b := s.db.NewBatchWithSize(size)
	defer b.Close()
	defer s.mu.inBatch.reset()
	s.mu.cps.batch = s.mu.cps.batch[:0] // what a failed batch left
	seq, applied := s.mu.nextSeq, uint64(0)
	s.mu.batches++
	batch := s.mu.batches
	n := 0
	fail := func(err error) {
		for i := range errs {
			if errs[i] == nil {
				errs[i] = err
			}
		}
	}
	for i, cp := range cps {
		st := states[i]
		states[i] = nil // until staged
		switch {
		case st == nil || st.table == nil:
			errs[i] = fmt.Errorf("durable sink: %w: %v", ErrNotBound, cp.ID)
			continue
		case st.table.id < 0:
			errs[i] = fmt.Errorf("durable sink: dispatcher %v: %w %d", cp.ID, ErrInvalidTable, st.table.id)
			continue
		}
		t := st.table
		newest := t.staged
		if t.stagedIn != batch {
			var err error
			if newest, err = s.newestLocked(t); err != nil {
				errs[i] = err
				continue
			}
		}
		hi, versions, err := s.stageLocked(b, st, cp.ID, t.id, newest, cp.Ts, &seq)
		if err != nil {
			fail(err) // the batch holds part of this entry: write none of it
			return
		}
		t.staged, t.stagedIn = hi, batch
		states[i] = st
		applied += versions
		n++
	}
	if n == 0 {
		return
	}
	if err := s.mu.cps.write(b); err != nil {
		fail(err)
		return
	}
	if err := b.Set([]byte("s"), binary.BigEndian.AppendUint64(nil, seq), nil); err != nil {
		fail(err)
		return
	}
	// NoSync: the crash tests kill the process, not the machine; the WAL
	// write reaches the OS. Rows and checkpoint are in one batch either way.
	if err := b.Commit(pebble.NoSync); err != nil {
		fail(err)
		return
	}
	s.mu.nextSeq = seq
	s.mu.applied += applied
	s.mu.lastBatch.made, s.mu.lastBatch.held = size, len(b.Repr())
	s.mu.cps.committed(n)
	for i, st := range states {
		if st == nil {
			continue
		}
		st.checkpoint = max(st.checkpoint, cps[i].Ts)
		st.dropPending() // the rows, the caller's, are not kept past their checkpoint
		if t := st.table; t.stagedIn == batch {
			t.newest, t.known = t.staged, true
		}
	}
	if s.mu.cps.dueForCut(len(s.mu.dispatchers)) {
		// The checkpoints are committed whatever the cut does: one that
		// fails leaves the log as it is, and the next batch tries again.
		_ = s.mu.cps.cut(s.db, s.eachCheckpointLocked)
	}
}

// eachCheckpointLocked calls fn with every persisted checkpoint.
// REQUIRES: s.mu held.
func (s *Sink) eachCheckpointLocked(fn func(common.DispatcherID, common.Ts)) {
	for id, st := range s.mu.dispatchers {
		if st.checkpoint > 0 {
			fn(id, st.checkpoint)
		}
	}
}

// stageLocked writes id's staged rows (skipping versions already present),
// DDLs and checkpoint ts into b, numbering new versions from *seq; newest
// is table's newest commit-ts so far. It returns the table's newest
// commit-ts with these rows and how many versions it wrote. REQUIRES: s.mu
// held.
func (s *Sink) stageLocked(b *pebble.Batch, st *dispatcherState, id common.DispatcherID, table int64, newest, ts common.Ts, seq *uint64) (common.Ts, uint64, error) {
	hi := newest
	var groupTs common.Ts
	var versions uint64
	g := &s.mu.group
	defer g.reset()
	for _, chunk := range st.pending {
		for i := range chunk {
			r := &chunk[i]
			// The lookup uses the same encoding as the write, so a re-delivery
			// finds its first application whatever other keys it prefixes.
			k := appendVersionKey(s.mu.key[:0], table, r.Key, r.CommitTs)
			s.mu.key = k // the scratch keeps what it grew to
			if r.CommitTs <= newest {
				if dup, err := s.storedLocked(b, k); err != nil {
					return 0, 0, err
				} else if dup {
					continue // a re-delivery: idempotent
				}
			} else {
				// Above every stored version: new, unless this batch
				// already holds it (rows come in commit-ts order, so a repeat
				// is in the same commit-ts group).
				if r.CommitTs != groupTs {
					g.reset()
					groupTs = r.CommitTs
				}
				if !g.add(k) {
					continue
				}
				hi = max(hi, r.CommitTs)
			}
			// Key and value are written into the batch in place: no copy of
			// either is made per row.
			op := b.SetDeferred(len(k), 8+1+len(r.Value))
			copy(op.Key, k)
			binary.BigEndian.PutUint64(op.Value, *seq)
			op.Value[8] = byte(r.Op)
			copy(op.Value[9:], r.Value)
			if err := op.Finish(); err != nil {
				return 0, 0, err
			}
			s.mu.inBatch.wrote(k)
			*seq++
			versions++
		}
	}
	for _, dl := range st.ddls {
		// Keyed by (table, commit-ts): a re-delivered DDL overwrites itself.
		if err := b.Set(ddlKey(table, dl.CommitTs), []byte(dl.Query), nil); err != nil {
			return 0, 0, err
		}
	}
	if hi > newest {
		if err := b.Set(newestKey(table), binary.BigEndian.AppendUint64(nil, uint64(hi)), nil); err != nil {
			return 0, 0, err
		}
	}
	s.mu.cps.add(id, ts)
	return hi, versions, nil
}

// storedLocked reports whether version key k is stored: in the batch b
// being written or in the database. REQUIRES: s.mu held.
func (s *Sink) storedLocked(b *pebble.Batch, k []byte) (bool, error) {
	if s.mu.inBatch.holds(b, k) {
		return true, nil
	}
	_, closer, err := s.db.Get(k)
	switch {
	case err == nil:
		_ = closer.Close()
		return true, nil
	case errors.Is(err, pebble.ErrNotFound):
		return false, nil
	default:
		return false, err
	}
}

// newestLocked returns m of t, read once from the database.
// REQUIRES: s.mu held.
func (s *Sink) newestLocked(t *tableState) (common.Ts, error) {
	if t.known {
		return t.newest, nil
	}
	v, err := s.getUint64(newestKey(t.id))
	if err != nil {
		return 0, err
	}
	t.newest, t.known = common.Ts(v), true
	return t.newest, nil
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

// quietPebble drops pebble's informational logs.
type quietPebble struct{}

func (quietPebble) Infof(string, ...any)           {}
func (quietPebble) Errorf(string, ...any)          {}
func (quietPebble) Fatalf(format string, a ...any) { panic(fmt.Sprintf(format, a...)) }

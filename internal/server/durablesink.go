package server

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// DurableSink is the downstream of the crash/restart tests: a pebble
// database that, like a real downstream database, applies row versions
// idempotently by (table, key, commit-ts) and persists each dispatcher's
// rows together with its checkpoint in one atomic batch. After a crash the
// server reads the checkpoints back and resumes every dispatcher from its
// own.
//
// Layout:
//
//	v | table(8) | key | commitTs(8)  -> seq(8) | op(1) | value   (one row version)
//	d | table(8) | commitTs(8)        -> query                    (one DDL)
//	c | dispatcher(16)                -> ts(8)                    (checkpoint)
//	s                                 -> next seq(8)
//
// seq numbers versions in the order they were first applied, so the
// verifier can check per-key order across restarts: for every key, a
// version with a higher commit-ts must have been applied later.
type DurableSink struct {
	db *pebble.DB

	mu struct {
		sync.Mutex
		nextSeq uint64
		tables  map[common.DispatcherID]int64
		pending map[common.DispatcherID][]common.Row
		ddls    map[common.DispatcherID][]messaging.DDL
		applied uint64
	}
}

// sinkCacheBytes is the durable sink's block cache.
const sinkCacheBytes = 64 << 20

// OpenDurableSink opens (or creates) the sink in dir.
func OpenDurableSink(dir string) (*DurableSink, error) {
	// Each row is looked up before it is written (a re-delivery must keep
	// its first application's sequence number), and nearly all lookups
	// miss: bloom filters answer those without reading the tables' index
	// blocks, which without them was 80% of a collector process's CPU
	// at 4,000 dispatchers.
	cache := pebble.NewCache(sinkCacheBytes)
	defer cache.Unref() // the DB holds its own reference
	opts := &pebble.Options{Logger: quietPebble{}, Cache: cache}
	for i := range opts.Levels {
		opts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	db, err := pebble.Open(dir, opts)
	if err != nil {
		return nil, fmt.Errorf("open durable sink: %w", err)
	}
	s := &DurableSink{db: db}
	s.mu.tables = map[common.DispatcherID]int64{}
	s.mu.pending = map[common.DispatcherID][]common.Row{}
	s.mu.ddls = map[common.DispatcherID][]messaging.DDL{}
	v, closer, err := db.Get([]byte("s"))
	switch {
	case err == nil:
		s.mu.nextSeq = binary.BigEndian.Uint64(v)
		_ = closer.Close()
	case errors.Is(err, pebble.ErrNotFound):
		s.mu.nextSeq = 1
	default:
		_ = db.Close()
		return nil, err
	}
	return s, nil
}

// Close closes the database.
func (s *DurableSink) Close() error { return s.db.Close() }

// Bind tells the sink which table a dispatcher applies to.
func (s *DurableSink) Bind(id common.DispatcherID, table int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.tables[id] = table
}

// CheckpointOf returns the persisted checkpoint of id, or 0.
func (s *DurableSink) CheckpointOf(id common.DispatcherID) (common.Ts, error) {
	b := id.Bytes()
	v, closer, err := s.db.Get(append([]byte("c"), b[:]...))
	if errors.Is(err, pebble.ErrNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer closer.Close()
	return common.Ts(binary.BigEndian.Uint64(v)), nil
}

// BeginEpoch drops what was applied since the last checkpoint: the new
// epoch re-sends it.
func (s *DurableSink) BeginEpoch(id common.DispatcherID, _ uint64, _ common.Ts) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.pending[id] = s.mu.pending[id][:0]
	s.mu.ddls[id] = s.mu.ddls[id][:0]
	return nil
}

// ApplyRows stages rows until the next checkpoint.
func (s *DurableSink) ApplyRows(id common.DispatcherID, rows []common.Row) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.pending[id] = append(s.mu.pending[id], rows...)
	return nil
}

// ApplyDDL stages a schema change until the next checkpoint, as rows are.
func (s *DurableSink) ApplyDDL(id common.DispatcherID, ddl *messaging.DDL) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.ddls[id] = append(s.mu.ddls[id], *ddl)
	return nil
}

// Checkpoint writes the staged rows of id (skipping versions already
// present) and the checkpoint in one batch.
func (s *DurableSink) Checkpoint(id common.DispatcherID, ts common.Ts) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	table, ok := s.mu.tables[id]
	if !ok {
		return fmt.Errorf("durable sink: dispatcher %v not bound", id)
	}
	b := s.db.NewIndexedBatch()
	defer b.Close()
	seq := s.mu.nextSeq
	for _, r := range s.mu.pending[id] {
		k := versionKey(table, r.Key, r.CommitTs)
		if _, closer, err := b.Get(k); err == nil {
			_ = closer.Close()
			continue // a re-delivery: idempotent
		} else if !errors.Is(err, pebble.ErrNotFound) {
			return err
		}
		v := binary.BigEndian.AppendUint64(nil, seq)
		v = append(v, byte(r.Op))
		v = append(v, r.Value...)
		if err := b.Set(k, v, nil); err != nil {
			return err
		}
		seq++
		s.mu.applied++
	}
	for _, dl := range s.mu.ddls[id] {
		// Keyed by (table, commit-ts): a re-delivered DDL overwrites itself.
		if err := b.Set(ddlKey(table, dl.CommitTs), []byte(dl.Query), nil); err != nil {
			return err
		}
	}
	idb := id.Bytes()
	if err := b.Set(append([]byte("c"), idb[:]...), binary.BigEndian.AppendUint64(nil, uint64(ts)), nil); err != nil {
		return err
	}
	if err := b.Set([]byte("s"), binary.BigEndian.AppendUint64(nil, seq), nil); err != nil {
		return err
	}
	// NoSync: the crash tests kill the process, not the machine; the WAL
	// write reaches the OS. Rows and checkpoint are in one batch either way.
	if err := b.Commit(pebble.NoSync); err != nil {
		return err
	}
	s.mu.nextSeq = seq
	s.mu.pending[id] = s.mu.pending[id][:0]
	s.mu.ddls[id] = s.mu.ddls[id][:0]
	return nil
}

func ddlKey(table int64, commitTs common.Ts) []byte {
	k := binary.BigEndian.AppendUint64([]byte{'d'}, uint64(table))
	return binary.BigEndian.AppendUint64(k, uint64(commitTs))
}

// DDLs returns the stored DDLs of table in commit-ts order.
func (s *DurableSink) DDLs(table int64) ([]messaging.DDL, error) {
	var out []messaging.DDL
	err := s.scanTable('d', table, func(k, v []byte) {
		out = append(out, messaging.DDL{TableID: table, CommitTs: common.Ts(binary.BigEndian.Uint64(k)), Query: string(v)})
	})
	return out, err
}

// scanTable calls fn, in key order, with every entry of table under the
// one-byte prefix kind: its key after the prefix and table, and its value
// (both valid only during the call).
func (s *DurableSink) scanTable(kind byte, table int64, fn func(k, v []byte)) error {
	lo := binary.BigEndian.AppendUint64([]byte{kind}, uint64(table))
	hi := binary.BigEndian.AppendUint64([]byte{kind}, uint64(table)+1)
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
		fn(it.Key()[len(lo):], v)
	}
	return it.Error()
}

func versionKey(table int64, key []byte, commitTs common.Ts) []byte {
	k := make([]byte, 0, 1+8+len(key)+8)
	k = append(k, 'v')
	k = binary.BigEndian.AppendUint64(k, uint64(table))
	k = append(k, key...)
	return binary.BigEndian.AppendUint64(k, uint64(commitTs))
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
// commit-ts.
func (s *DurableSink) Versions(table int64) ([]Version, error) {
	var out []Version
	err := s.scanTable('v', table, func(k, v []byte) {
		out = append(out, Version{
			Key:      bytes.Clone(k[:len(k)-8]),
			CommitTs: common.Ts(binary.BigEndian.Uint64(k[len(k)-8:])),
			Seq:      binary.BigEndian.Uint64(v),
			Op:       common.OpType(v[8]),
			Value:    bytes.Clone(v[9:]),
		})
	})
	return out, err
}

// quietPebble drops pebble's informational logs.
type quietPebble struct{}

func (quietPebble) Infof(string, ...any)           {}
func (quietPebble) Errorf(string, ...any)          {}
func (quietPebble) Fatalf(format string, a ...any) { panic(fmt.Sprintf(format, a...)) }

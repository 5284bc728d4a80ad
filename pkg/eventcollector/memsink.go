package eventcollector

import (
	"bytes"
	"cmp"
	"context"
	"slices"
	"sync"

	"github.com/cdcflow/eventservice/internal/slots"
	"github.com/cdcflow/eventservice/internal/touchahead"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// MemorySink is a Sink that records everything applied, per dispatcher and
// per epoch, for tests, the demo server and verification. Its memory grows
// with every row applied: it is not meant for long runs.
//
// It is safe for concurrent use: the collector writes, any goroutine reads,
// and Wait/WaitCheckpoint let a reader wait for a condition without
// sleeping.
type MemorySink struct {
	mu struct {
		sync.Mutex
		// dispatchers maps IDs to entries through slots, so that its map
		// holds no pointers for a GC cycle to visit (slots.Index).
		dispatchers slots.Index[common.DispatcherID, *memDispatcher]
		// slab is the chunk new dispatchers are carved from (newLocked).
		slab []memDispatcher
		// arena holds every applied row, untraced by the GC (memrows.go).
		arena rowArena
		// bySlot caches dispatchers by the collector's slot
		// (SinkCheckpoint.Slot), checked against the ID, so that
		// CheckpointBatch, the sink's most frequent call, probes no map.
		bySlot []*memDispatcher
		// touched is the last touch-ahead's sum (touchLocked): written
		// so the loads stay, never read.
		touched uint64
		// changed is closed and replaced at the next change once someone
		// took it, so a waiter that checks after taking it misses nothing.
		changed chan struct{}
		watched bool
	}
}

var (
	_ Sink              = (*MemorySink)(nil)
	_ CheckpointBatcher = (*MemorySink)(nil)
)

// EpochRecord is what a MemorySink received for one dispatcher in one
// epoch, in application order.
type EpochRecord struct {
	Epoch   uint64
	StartTs common.Ts
	Rows    []common.Row
	DDLs    []messaging.DDL
	// Checkpoints counts the Checkpoint calls of the epoch and
	// LastCheckpoint is the latest. CheckpointRegressions counts the calls
	// whose ts was not above the dispatcher's previous checkpoint (in any
	// epoch), which a collector must never make. Counted rather than
	// listed: a dispatcher checkpoints up to a hundred times a second, and
	// a list held every one for the whole run.
	Checkpoints           int
	LastCheckpoint        common.Ts
	CheckpointRegressions int
}

// memDispatcher is one dispatcher's record, carved from the sink's slab
// (newLocked). At a million dispatchers each byte here is a megabyte of
// the synthetic run's heap, so the record of its first epoch is inline,
// later epochs are allocated, and counts are 32 bits (a dispatcher
// checkpoints at most about a hundred times a second).
type memDispatcher struct {
	// The fields a checkpoint touches come first, so that it reads as few
	// cache lines as the allocation's alignment allows: id (the key it is
	// mapped by, checked by the slot cache), the highest checkpoint and
	// the current epoch's checkpoint counts, kept here rather than in the
	// epoch's record and folded into it when the next epoch opens (fold):
	// a checkpoint, the sink's most frequent call, then touches one
	// struct, not also a cold line through a pointer to the epoch.
	id                             common.DispatcherID
	checkpoint                     common.Ts
	curLast                        common.Ts
	curCheckpoints, curRegressions int32
	// opened: the first epoch is open (first holds it). more are the
	// epochs after the first; the current one is the last of them, or
	// first.
	opened bool
	more   []*memEpoch
	// curRows are the current epoch's ApplyRows batches, as ranges of
	// the sink's arena, folded into the epoch's rows likewise. Appending
	// each batch's rows to one slice per epoch copied a hot table's whole
	// history at every doubling, in the collector's goroutine and under
	// the sink's lock, holding up every dispatcher of the changefeed.
	curRows []refRange
	first   memEpoch
}

// memEpoch is one epoch's record, its rows kept as ranges of the sink's
// arena (EpochRecord is built when read, its rows materialised).
type memEpoch struct {
	epoch          uint64
	startTs        common.Ts
	lastCheckpoint common.Ts
	ddls           []messaging.DDL
	rows           []refRange
	checkpoints    int32
	regressions    int32
}

// record returns e as an EpochRecord, its rows read from arena.
func (e *memEpoch) record(arena *rowArena) EpochRecord {
	return EpochRecord{Epoch: e.epoch, StartTs: e.startTs, Rows: arena.appendRows(nil, e.rows),
		DDLs: slices.Clone(e.ddls), Checkpoints: int(e.checkpoints), LastCheckpoint: e.lastCheckpoint,
		CheckpointRegressions: int(e.regressions)}
}

// current returns the open epoch, nil before the first.
func (d *memDispatcher) current() *memEpoch {
	switch {
	case len(d.more) > 0:
		return d.more[len(d.more)-1]
	case d.opened:
		return &d.first
	}
	return nil
}

// epochs yields d's epochs, oldest first.
func (d *memDispatcher) epochs(yield func(*memEpoch) bool) {
	if !d.opened || !yield(&d.first) {
		return
	}
	for _, e := range d.more {
		if !yield(e) {
			return
		}
	}
}

// open starts an epoch and makes it current.
func (d *memDispatcher) open(epoch uint64, startTs common.Ts) *memEpoch {
	d.fold()
	e := &d.first
	if d.opened {
		e = new(memEpoch)
		d.more = append(d.more, e)
	}
	d.opened = true
	e.epoch, e.startTs = epoch, startTs
	return e
}

// currentOrOpen returns the open epoch, opening epoch 0 for a sink used
// without BeginEpoch.
func (d *memDispatcher) currentOrOpen() *memEpoch {
	if e := d.current(); e != nil {
		return e
	}
	return d.open(0, 0)
}

// fold moves the current epoch's checkpoint counts and rows into its
// record.
func (d *memDispatcher) fold() {
	cur := d.current()
	if cur == nil {
		return
	}
	if d.curCheckpoints > 0 {
		cur.checkpoints += d.curCheckpoints
		cur.regressions += d.curRegressions
		cur.lastCheckpoint = d.curLast
		d.curCheckpoints, d.curRegressions = 0, 0
	}
	if len(d.curRows) > 0 {
		cur.rows = append(cur.rows, d.curRows...) // the batches, not their rows
		clear(d.curRows)
		d.curRows = d.curRows[:0]
	}
}

// NewMemorySink returns an empty sink.
func NewMemorySink() *MemorySink {
	s := &MemorySink{}
	s.mu.changed = make(chan struct{})
	return s
}

func (s *MemorySink) dispatcherLocked(id common.DispatcherID) *memDispatcher {
	d, ok := s.mu.dispatchers.Lookup(id)
	if !ok {
		d = s.newLocked(id)
		s.mu.dispatchers.Add(d)
	}
	return d
}

// memSlabDispatchers is how many dispatchers a slab chunk holds at most
// (about 220 KB of them); the first chunks are smaller (from 16, doubling),
// so that a sink of a few dispatchers stays small.
const memSlabDispatchers = 1024

// newLocked returns a new dispatcher carved from the current slab chunk,
// starting a chunk when it is full. The sink never forgets a dispatcher, so
// a chunk lives as long as the sink and carving frees nothing early. One
// object per dispatcher made every GC cycle visit a million objects
// scattered over the heap for the sink alone; a chunk is one object, and
// the pointers into it (the map's, the slot cache's, a dispatcher's to its
// own first epoch) find its span in the cache.
// REQUIRES: s.mu held.
func (s *MemorySink) newLocked(id common.DispatcherID) *memDispatcher {
	if len(s.mu.slab) == cap(s.mu.slab) {
		n := min(memSlabDispatchers, max(16, 2*cap(s.mu.slab)))
		s.mu.slab = make([]memDispatcher, 0, n) // the full one stays, held by its dispatchers' pointers
	}
	s.mu.slab = append(s.mu.slab, memDispatcher{id: id})
	return &s.mu.slab[len(s.mu.slab)-1]
}

// changedLocked wakes the waiters. REQUIRES: s.mu held.
func (s *MemorySink) changedLocked() {
	if s.mu.watched {
		close(s.mu.changed)
		s.mu.changed = make(chan struct{})
		s.mu.watched = false
	}
}

// BeginEpoch implements Sink: it opens a new epoch record.
func (s *MemorySink) BeginEpoch(id common.DispatcherID, epoch uint64, startTs common.Ts) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dispatcherLocked(id).open(epoch, startTs)
	s.changedLocked()
	return nil
}

// ApplyRows implements Sink. The rows are copied into the sink's arena,
// where the GC does not trace them (memrows.go); the caller's memory is
// not kept.
func (s *MemorySink) ApplyRows(id common.DispatcherID, rows []common.Row) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	d := s.dispatcherLocked(id)
	d.currentOrOpen()
	if len(rows) > 0 {
		d.curRows = append(d.curRows, s.mu.arena.add(rows))
	}
	s.changedLocked()
	return nil
}

// ApplyDDL implements Sink.
func (s *MemorySink) ApplyDDL(id common.DispatcherID, ddl *messaging.DDL) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.dispatcherLocked(id).currentOrOpen()
	e.ddls = append(e.ddls, *ddl)
	s.changedLocked()
	return nil
}

// Checkpoint implements Sink.
func (s *MemorySink) Checkpoint(id common.DispatcherID, ts common.Ts) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.checkpointLocked(id, ts)
	s.changedLocked()
	return nil
}

// CheckpointBatch implements CheckpointBatcher: every entry as Checkpoint
// would apply it, under one lock and with one wake-up of the waiters. It
// never fails.
func (s *MemorySink) CheckpointBatch(cps []SinkCheckpoint, errs []error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for start := 0; start < len(cps); start += touchahead.Chunk {
		chunk := cps[start:min(start+touchahead.Chunk, len(cps))]
		s.touchLocked(chunk)
		for i := range chunk {
			s.checkpointOfLocked(s.bySlotLocked(chunk[i].ID, chunk[i].Slot), chunk[i].Ts)
			errs[start+i] = nil
		}
	}
	s.changedLocked()
}

// touchLocked reads the words of the chunk's dispatchers that a checkpoint
// reads first, so that their cache misses overlap (internal/touchahead).
// It changes nothing but s.mu.touched, which keeps the loads from being
// compiled away. REQUIRES: s.mu held.
func (s *MemorySink) touchLocked(chunk []SinkCheckpoint) {
	var t uint64
	for i := range chunk {
		if slot := chunk[i].Slot; int(slot) < len(s.mu.bySlot) {
			if d := s.mu.bySlot[slot]; d != nil {
				t += d.id.Lo + uint64(d.curLast)
			}
		}
	}
	s.mu.touched = t
}

// maxSlotCache bounds the slots bySlot caches: a slot beyond it (the
// collector holds fewer dispatchers at once) goes through the map.
const maxSlotCache = 1 << 22

// bySlotLocked returns id's dispatcher, through the slot cache when slot
// holds it, else through the map (and caches it under slot).
// REQUIRES: s.mu held.
func (s *MemorySink) bySlotLocked(id common.DispatcherID, slot uint32) *memDispatcher {
	if int(slot) < len(s.mu.bySlot) {
		if d := s.mu.bySlot[slot]; d != nil && d.id == id {
			return d
		}
	}
	d := s.dispatcherLocked(id)
	if slot < maxSlotCache {
		if int(slot) >= len(s.mu.bySlot) {
			s.mu.bySlot = slices.Grow(s.mu.bySlot, int(slot)+1-len(s.mu.bySlot))[:slot+1]
		}
		s.mu.bySlot[slot] = d
	}
	return d
}

// checkpointLocked records a checkpoint of id. REQUIRES: s.mu held.
func (s *MemorySink) checkpointLocked(id common.DispatcherID, ts common.Ts) {
	s.checkpointOfLocked(s.dispatcherLocked(id), ts)
}

// checkpointOfLocked records a checkpoint of d. REQUIRES: s.mu held.
func (s *MemorySink) checkpointOfLocked(d *memDispatcher, ts common.Ts) {
	d.currentOrOpen()
	d.curCheckpoints++
	d.curLast = ts
	if ts <= d.checkpoint {
		d.curRegressions++
	}
	d.checkpoint = max(d.checkpoint, ts)
}

// Dispatchers returns the IDs the sink has seen, in no particular order.
func (s *MemorySink) Dispatchers() []common.DispatcherID {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]common.DispatcherID, 0, s.mu.dispatchers.Len())
	for d := range s.mu.dispatchers.All() {
		out = append(out, d.id)
	}
	return out
}

// Epochs returns a copy of id's epoch records, oldest first (nil if none).
func (s *MemorySink) Epochs(id common.DispatcherID) []EpochRecord {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.mu.dispatchers.Lookup(id)
	if !ok {
		return nil
	}
	d.fold()
	var out []EpochRecord
	for e := range d.epochs {
		out = append(out, e.record(&s.mu.arena))
	}
	return out
}

// Applied returns every row applied for id since the start, across epochs,
// in application order: re-deliveries after a reset appear again.
func (s *MemorySink) Applied(id common.DispatcherID) []common.Row {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.mu.dispatchers.Lookup(id)
	if !ok {
		return nil
	}
	d.fold()
	var out []common.Row
	for e := range d.epochs {
		out = s.mu.arena.appendRows(out, e.rows)
	}
	return out
}

// AppliedDDLs returns every DDL applied for id since the start, across
// epochs, in application order.
func (s *MemorySink) AppliedDDLs(id common.DispatcherID) []messaging.DDL {
	s.mu.Lock()
	defer s.mu.Unlock()
	d, ok := s.mu.dispatchers.Lookup(id)
	if !ok {
		return nil
	}
	var out []messaging.DDL
	for e := range d.epochs {
		out = append(out, e.ddls...)
	}
	return out
}

// Deduplicated returns what an idempotent downstream holds for id: the rows
// applied since the start, one per (commit-ts, key), the latest applied
// winning, sorted by (commit-ts, start-ts, key), the store's order.
func (s *MemorySink) Deduplicated(id common.DispatcherID) []common.Row {
	type rowKey struct {
		commitTs common.Ts
		key      string
	}
	all := s.Applied(id)
	idx := make(map[rowKey]int, len(all))
	out := make([]common.Row, 0, len(all))
	for _, r := range all {
		k := rowKey{r.CommitTs, string(r.Key)}
		if i, ok := idx[k]; ok {
			out[i] = r
			continue
		}
		idx[k] = len(out)
		out = append(out, r)
	}
	SortRows(out)
	return out
}

// SortRows sorts rows by (commit-ts, start-ts, key), the store's order.
func SortRows(rows []common.Row) {
	slices.SortFunc(rows, func(a, b common.Row) int {
		if c := cmp.Compare(a.CommitTs, b.CommitTs); c != 0 {
			return c
		}
		if c := cmp.Compare(a.StartTs, b.StartTs); c != 0 {
			return c
		}
		return bytes.Compare(a.Key, b.Key)
	})
}

// CheckpointOf returns the highest checkpoint applied for id (zero if none).
func (s *MemorySink) CheckpointOf(id common.DispatcherID) common.Ts {
	s.mu.Lock()
	defer s.mu.Unlock()
	if d, ok := s.mu.dispatchers.Lookup(id); ok {
		return d.checkpoint
	}
	return 0
}

// Changed returns a channel closed at the sink's next change. Take it,
// check the state, then wait on it: no change is missed.
func (s *MemorySink) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.watched = true
	return s.mu.changed
}

// Wait returns nil once cond holds, checking it now and after every change,
// or ctx.Err() if ctx ends first. cond runs without the sink's lock held,
// so it may call the sink's methods.
func (s *MemorySink) Wait(ctx context.Context, cond func() bool) error {
	for {
		changed := s.Changed()
		if cond() {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// WaitCheckpoint waits until id's checkpoint reaches ts; see Wait.
func (s *MemorySink) WaitCheckpoint(ctx context.Context, id common.DispatcherID, ts common.Ts) error {
	return s.Wait(ctx, func() bool { return s.CheckpointOf(id) >= ts })
}

// SlotKey is d's key in the sink's index (slots.Keyed).
func (d *memDispatcher) SlotKey() common.DispatcherID { return d.id }

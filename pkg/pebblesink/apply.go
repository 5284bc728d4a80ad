package pebblesink

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventcollector"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// Applying: rows and DDLs staged per dispatcher, written with their checkpoint in one batch.

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

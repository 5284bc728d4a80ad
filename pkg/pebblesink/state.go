package pebblesink

import (
	"bytes"
	"encoding/binary"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// dispatcherState is what the sink holds for one dispatcher, found by one
// map probe per call, not a probe per field (its table, rows, DDLs,
// checkpoint) on 16-byte keys.
type dispatcherState struct {
	table *tableState // nil until Bind
	// pending are the rows staged since the last checkpoint, as the
	// slices ApplyRows was given (the Sink contract lets the sink keep
	// them), in the order given; pendingBytes is what they will take in
	// the checkpoint's batch (batchBytes). Appending each call's rows to
	// one slice copied a hot dispatcher's rows again at every doubling.
	pending      [][]common.Row
	pendingBytes int
	ddls         []messaging.DDL
	checkpoint   common.Ts // the persisted checkpoint
}

// dropPending forgets the staged rows and DDLs (their checkpoint was
// written, or a new epoch re-sends them). The slices' arrays are kept for
// the next rows; the references to the rows are dropped for the GC.
func (st *dispatcherState) dropPending() {
	clear(st.pending)
	st.pending, st.pendingBytes, st.ddls = st.pending[:0], 0, st.ddls[:0]
}

// batchBytes is at least what rows take in a pebble batch: per row, the
// record's kind and two length varints, the version key (the table, the
// escaped key, one more byte per zero byte in it, and the commit-ts) and
// the value (the sequence number, the op and the row's value). A batch
// sized by it is not grown (a grown batch copies everything it holds: a
// checkpoint batch of a collector process at 400k rows/s holds tens of
// MiB).
func batchBytes(rows []common.Row) int {
	const perRow = 1 + 2*binary.MaxVarintLen32 + versionKeyOverhead + 8 + 1
	n := 0
	for i := range rows {
		n += perRow + len(rows[i].Key) + bytes.Count(rows[i].Key, []byte{0}) + len(rows[i].Value)
	}
	return n
}

// tableState is what the sink holds for one table.
type tableState struct {
	id int64
	// newest is m, once known (read from the database, or written).
	newest common.Ts
	known  bool
	// staged is the table's newest commit-ts with the batch being
	// written, valid while stagedIn is that batch's number.
	staged   common.Ts
	stagedIn uint64
}

// stateLocked returns id's state, made if it has none. REQUIRES: s.mu held.
func (s *Sink) stateLocked(id common.DispatcherID) *dispatcherState {
	st := s.mu.dispatchers[id]
	if st == nil {
		st = &dispatcherState{}
		s.mu.dispatchers[id] = st
	}
	return st
}

// tableLocked returns table's state, made if it has none. REQUIRES: s.mu
// held.
func (s *Sink) tableLocked(table int64) *tableState {
	t := s.mu.tables[table]
	if t == nil {
		t = &tableState{id: table}
		s.mu.tables[table] = t
	}
	return t
}

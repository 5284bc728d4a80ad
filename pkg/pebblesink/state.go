package pebblesink

import (
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// dispatcherState is what the sink holds for one dispatcher, found by one
// map probe per call: a probe per field (its table, rows, DDLs,
// checkpoint), on 16-byte keys, was a third of a collector process's CPU
// at 100k dispatchers.
type dispatcherState struct {
	table      *tableState // nil until Bind
	pending    []common.Row
	ddls       []messaging.DDL
	checkpoint common.Ts // the persisted checkpoint
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

package pgsink

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// Per dispatcher: the collector's calls, queued to its lane, and what the lanes report back.

// SetDurable implements eventcollector.AsyncSink.
func (s *Sink) SetDurable(f func(id common.DispatcherID, epoch uint64, ts common.Ts)) {
	s.durableFn = f
}

// MinDurable returns the lowest durable checkpoint of the bound
// dispatchers (ok false with none): what the source's slot may follow.
func (s *Sink) MinDurable() (common.Ts, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var lo common.Ts
	ok := false
	for id := range s.mu.bound {
		if s.mu.released[id] {
			continue // let go of: the slot no longer waits for it
		}
		ts := s.mu.durable[id]
		if !ok || ts < lo {
			lo, ok = ts, true
		}
	}
	return lo, ok
}

// Durable returns a dispatcher's durable checkpoint.
func (s *Sink) Durable(id common.DispatcherID) common.Ts {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.durable[id]
}

// Stopped names the tables stopped by a schema change the sink cannot
// apply (or changes the target kept refusing), with why, sorted.
func (s *Sink) Stopped() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.mu.stopped))
	for _, st := range s.mu.stopped {
		out = append(out, st.reason)
	}
	sort.Strings(out)
	return out
}

// stoppedTable is why and since when a table stopped.
type stoppedTable struct {
	reason string
	since  time.Time
}

// StoppedTable is a stopped table.
type StoppedTable struct {
	ID common.DispatcherID
	// OID and Table name the source table.
	OID    uint32
	Table  string
	Reason string
	Since  time.Time
	// Released: its hold on the slot was let go (Release).
	Released bool
}

// StoppedTables lists the stopped tables, by table name.
func (s *Sink) StoppedTables() []StoppedTable {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]StoppedTable, 0, len(s.mu.stopped))
	for id, st := range s.mu.stopped {
		t := StoppedTable{ID: id, Reason: st.reason, Since: st.since, Released: s.mu.released[id]}
		if b := s.mu.bound[id]; b != nil {
			t.OID, t.Table = b.rel.OID, b.rel.QualifiedName()
		}
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Table < out[j].Table })
	return out
}

// Release lets go of a stopped table's hold on the slot: its checkpoint
// row is deleted (fenced) and its durable checkpoint no longer counts in
// MinDurable, so the slot moves on past the changes it will never apply.
// The table stays stopped; what it lacks is for a fresh copy to fill (the
// caller owes one: with its checkpoint gone, a later start takes it for a
// table never copied). ErrNotStopped for a table that is not stopped.
func (s *Sink) Release(ctx context.Context, id common.DispatcherID) error {
	s.mu.Lock()
	_, stopped := s.mu.stopped[id]
	s.mu.Unlock()
	if !stopped {
		return fmt.Errorf("%w: %v", ErrNotStopped, id)
	}
	if err := s.fenced(ctx, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "DELETE FROM cdcflow.checkpoints WHERE dispatcher = $1", hexID(id))
		return err
	}); err != nil {
		return err
	}
	s.mu.Lock()
	s.mu.released[id] = true
	s.mu.Unlock()
	return nil
}

// laneOf returns id's lane and any error its last work left, which the
// caller returns (the collector then resets the dispatcher).
func (s *Sink) laneOf(id common.DispatcherID) (*lane, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return nil, false, ErrClosed
	}
	b := s.mu.bound[id]
	if b == nil {
		return nil, false, fmt.Errorf("%w: %v", ErrUnknownDispatcher, id)
	}
	if err := s.mu.errs[id]; err != nil {
		delete(s.mu.errs, id)
		return nil, false, err
	}
	_, stopped := s.mu.stopped[id]
	return b.lane, stopped || s.mu.superseded, nil
}

// BeginEpoch implements eventcollector.Sink.
func (s *Sink) BeginEpoch(id common.DispatcherID, epoch uint64, startTs common.Ts) error {
	s.mu.Lock()
	delete(s.mu.errs, id) // the reset the error asked for
	s.mu.Unlock()
	l, stopped, err := s.laneOf(id)
	if err != nil || stopped {
		return err
	}
	return l.enqueue(op{kind: opBegin, id: id, epoch: epoch, ts: startTs})
}

// ApplyRows implements eventcollector.Sink: the rows are queued.
func (s *Sink) ApplyRows(id common.DispatcherID, rows []common.Row) error {
	l, stopped, err := s.laneOf(id)
	if err != nil || stopped {
		return err
	}
	return l.enqueue(op{kind: opRows, id: id, rows: rows})
}

// ApplyDDL implements eventcollector.Sink: a relation DDL is queued.
func (s *Sink) ApplyDDL(id common.DispatcherID, ddl *messaging.DDL) error {
	l, stopped, err := s.laneOf(id)
	if err != nil || stopped {
		return err
	}
	return l.enqueue(op{kind: opDDL, id: id, ddl: ddl.Query})
}

// Checkpoint implements eventcollector.Sink: the checkpoint is queued
// behind the rows; it is durable once reported through SetDurable's
// function.
func (s *Sink) Checkpoint(id common.DispatcherID, ts common.Ts) error {
	l, stopped, err := s.laneOf(id)
	if err != nil || stopped {
		return err
	}
	return l.enqueue(op{kind: opCheckpoint, id: id, ts: ts})
}

// committed records what a lane's transaction made durable.
func (s *Sink) committed(done []durableMark) {
	s.mu.Lock()
	for _, d := range done {
		if s.mu.bound[d.id] != nil && d.ts > s.mu.durable[d.id] {
			s.mu.durable[d.id] = d.ts
		}
	}
	s.mu.Unlock()
	if s.durableFn != nil {
		for _, d := range done {
			s.durableFn(d.id, d.epoch, d.ts)
		}
	}
}

// failed records a dispatcher's error for its next call; stop also stops
// its table.
func (s *Sink) failed(id common.DispatcherID, err error, stop bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if stop {
		if _, was := s.mu.stopped[id]; !was {
			s.mu.stopped[id] = stoppedTable{reason: err.Error(), since: s.opts.Clock.Now()}
			s.met.stopped.Inc()
			s.log.Error("table stopped", zap.Stringer("dispatcher", id), zap.Error(err))
		}
		return
	}
	s.mu.errs[id] = err
}

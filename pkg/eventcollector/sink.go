package eventcollector

import (
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// Sink is where the dispatchers' changes go: the downstream.
//
// The collector calls it from its receive goroutine only, one call at a
// time, so an implementation needs no locking for the collector's sake. Per
// dispatcher the calls follow its stream: BeginEpoch, then rows and DDLs in
// commit-ts order (a DDL after the rows of its commit-ts), with Checkpoint
// whenever a resolved-ts proves everything at or below it was applied; a
// reset starts over with BeginEpoch of a higher epoch. A dispatcher removed
// and added again (a new registration) starts over with BeginEpoch of epoch
// 1 from the start-ts it was added with; no call of the earlier
// registration comes after RemoveDispatcher returned.
//
// A call may block (a slow downstream). The collector then stops draining
// its inbox, the bounded inbox fills and the service's sends are refused:
// that is the back-pressure path. A call cannot be interrupted; Close waits
// for the one in flight.
//
// An error makes the collector reset the dispatcher: it is re-sent from its
// last checkpoint in a new epoch, so a sink must tolerate seeing changes
// above its checkpoint again (apply idempotently, or discard what it had not
// checkpointed when BeginEpoch comes).
type Sink interface {
	// BeginEpoch says that a stream of id starts (its handshake arrived):
	// what follows has commit-ts above startTs, which is the dispatcher's
	// last checkpoint (or, in its first epoch, its start-ts). Anything
	// applied after the last Checkpoint may be delivered again, including
	// the beginning of a transaction that was cut in the previous epoch.
	BeginEpoch(id common.DispatcherID, epoch uint64, startTs common.Ts) error
	// ApplyRows applies rows of id in commit-ts order. They may end with
	// (or be) a fragment of a transaction split across calls; it is
	// complete once a later call ends it. rows is never modified afterwards
	// and the sink may keep it; it must not modify it.
	ApplyRows(id common.DispatcherID, rows []common.Row) error
	// ApplyDDL applies a schema change of id, after the rows of its
	// commit-ts. ddl is never modified afterwards; the sink must not modify
	// it.
	ApplyDDL(id common.DispatcherID, ddl *messaging.DDL) error
	// Checkpoint says everything of id at or below ts has been applied. It
	// is called at transaction boundaries only and ts strictly increases
	// per dispatcher. A durable sink persists its rows and the checkpoint
	// together here: the collector heartbeats ts to the service only after
	// Checkpoint returned nil, and the store may then discard rows at or
	// below it.
	Checkpoint(id common.DispatcherID, ts common.Ts) error
}

// AsyncSink is a Sink that applies in the background: ApplyRows and
// Checkpoint only queue (they may block while its queues are full, which
// is back-pressure), and the sink reports each checkpoint once it is
// durable, with the rows before it, through the function the collector
// gives it. The collector then heartbeats only durable checkpoints, and a
// reset starts from the last durable one, so nothing the sink had queued
// but not persisted is lost. This is what lets a sink apply many
// dispatchers' rows in parallel and in one transaction, where a Checkpoint
// that persists before it returns would put every table behind one
// database round trip.
//
// A sink that fails to apply a dispatcher's work returns the error from
// its next call for that dispatcher (the collector resets it); a reset's
// BeginEpoch discards what the sink had queued for the dispatcher and not
// persisted.
type AsyncSink interface {
	Sink
	// SetDurable is called once, by New, before any other call. durable
	// may be called from any goroutine, not under a lock the sink's
	// methods take (the collector may be calling one), with strictly
	// increasing ts per dispatcher and epoch. durable takes the collector's
	// lock briefly and calls nothing of the sink, so it returns at once.
	SetDurable(durable func(id common.DispatcherID, epoch uint64, ts common.Ts))
}

// SinkCheckpoint is one entry of a CheckpointBatcher call.
type SinkCheckpoint struct {
	ID common.DispatcherID
	Ts common.Ts
	// Slot is the dispatcher's index in the collector: dense (below the
	// number of dispatchers the collector has held at once), fixed while
	// the dispatcher is registered, and given to another dispatcher after
	// it is removed. A sink may keep its per-dispatcher state in a slice
	// indexed by it, checking the ID, instead of probing a map on the
	// 16-byte ID at every checkpoint (at many dispatchers each probe is a
	// cache miss of its own). It is a hint: ID is what the entry is for.
	Slot uint32
}

// CheckpointBatcher is a Sink that confirms many dispatchers' checkpoints
// in one call: for a resolved-ts batch the collector makes one
// CheckpointBatch instead of one Checkpoint per entry, so a durable sink
// commits once for all of them (one pebble commit per dispatcher was a
// collector process's cost). errs[i] (len(errs) == len(cps)) is what
// Checkpoint(cps[i].ID, cps[i].Ts) would have returned, and each entry is
// as atomic with its rows as there: a sink that cannot commit the batch
// fails every entry of it. The dispatchers of one call are distinct.
type CheckpointBatcher interface {
	CheckpointBatch(cps []SinkCheckpoint, errs []error)
}

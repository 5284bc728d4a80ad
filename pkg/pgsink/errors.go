package pgsink

import "errors"

// Sentinel errors. Every error the sink returns wraps one of them (or is
// the caller's context's, or the target's own, wrapped with %w).
var (
	// ErrInvalidOptions: Options failed validation.
	ErrInvalidOptions = errors.New("pgsink: invalid options")
	// ErrConnect: the target cannot be reached.
	ErrConnect = errors.New("pgsink: cannot connect to the target")
	// ErrUnknownDispatcher: a call for a dispatcher that was never bound.
	ErrUnknownDispatcher = errors.New("pgsink: unknown dispatcher")
	// ErrSchemaChange: a schema change the sink cannot apply (a column
	// dropped or renamed, a type or the key changed); the table stops.
	ErrSchemaChange = errors.New("pgsink: unsupported schema change")
	// ErrApply: the target refused a dispatcher's changes.
	ErrApply = errors.New("pgsink: apply failed")
	// ErrClosed: the sink is closed.
	ErrClosed = errors.New("pgsink: closed")
	// ErrNotStarted: a fenced call (SetState, Reset, ClearProgress,
	// CheckFence) before Start.
	ErrNotStarted = errors.New("pgsink: not started")
	// ErrAnotherOwner: with SoleOwner, the target already holds another
	// owner's sink (Start).
	ErrAnotherOwner = errors.New("pgsink: the target holds another owner")
	// ErrNotStopped: Release of a table that is not stopped.
	ErrNotStopped = errors.New("pgsink: the table is not stopped")
	// ErrOtherSource: the owner's row binds it to another source
	// database than Options.Source (Start).
	ErrOtherSource = errors.New("pgsink: the target's changefeed replicates another source")
	// ErrTargetTaken: a table's target table holds another source
	// table's rows (one dropped and created again under the same name, or
	// renamed away); the table stops rather than mix them.
	ErrTargetTaken = errors.New("pgsink: the target table holds another source table's rows")
	// ErrSuperseded: a later sink of the same Owner started on the target;
	// this one writes nothing more (fence.go).
	ErrSuperseded = errors.New("pgsink: superseded by a later sink of the same owner")
	// ErrNotPermitted: Options.Permit refused a write (the node's lease
	// could have expired); the sink writes nothing more, as superseded.
	ErrNotPermitted = errors.New("pgsink: a write was not permitted")
	// ErrCorruptProgress: a record of the target's progress
	// (cdcflow.checkpoints) holds what the sink never writes, so it cannot
	// be resumed from.
	ErrCorruptProgress = errors.New("pgsink: the target's progress records are corrupt")
)

// errBadData marks a dispatcher's work the sink itself refused (a value
// that does not decode, a delete without its key): the table's fault,
// found before the server saw it (classify).
var errBadData = errors.New("pgsink: bad change")

package schemastore

import (
	"fmt"

	"github.com/cdcflow/eventservice/pkg/common"
)

// DDL is one schema change of one table.
type DDL struct {
	TableID  int64
	CommitTs common.Ts
	// Query is the statement text, carried through to the receiver verbatim.
	Query string
}

// String formats d for logs.
func (d DDL) String() string {
	return fmt.Sprintf("ddl(table %d @ %d: %q)", d.TableID, uint64(d.CommitTs), d.Query)
}

// validate checks the fields a DDL must have whatever the store's state.
func (d DDL) validate() error {
	if d.TableID < 0 {
		return fmt.Errorf("%w: negative table id %d", ErrInvalidDDL, d.TableID)
	}
	if d.CommitTs == 0 {
		return fmt.Errorf("%w: zero commit-ts for table %d", ErrInvalidDDL, d.TableID)
	}
	return nil
}

// Store is what the event service's scan scheduler needs from a schema store:
// the DDL frontier, cheap per-table DDL state, the DDLs of a range, and a
// signal when the frontier advances (so a dispatcher held by the frontier is
// retried without waiting for an event-store notification).
//
// Implementations are safe for concurrent use. Reads must not block each
// other, and none of them may block on a subscriber callback.
type Store interface {
	// ResolvedTs returns the frontier: every DDL with commit-ts <= it is
	// known. It never decreases.
	ResolvedTs() common.Ts

	// TableState returns the frontier and the commit-ts of the table's last
	// DDL at or below it (zero if none), read atomically together. A caller
	// holding a checkpoint C can conclude "no DDL in (C, resolvedTs]" from
	// lastDDLCommitTs <= C without fetching anything. An unknown or negative
	// table ID has no DDLs.
	TableState(tableID int64) (resolvedTs, lastDDLCommitTs common.Ts)

	// FetchDDLs appends to dst the table's DDLs with commit-ts in (start, end],
	// in ascending commit-ts order, and returns the extended slice. It fails
	// with ErrInvalidRange if start > end or tableID < 0, with
	// ErrRangeAboveResolved if end > ResolvedTs(), and (for implementations
	// that GC) with ErrRangeTruncated if the range reaches below the table's
	// GC point. On error dst is returned unchanged.
	FetchDDLs(tableID int64, start, end common.Ts, dst []DDL) ([]DDL, error)

	// Subscribe registers fn to be told when the frontier advances. fn is
	// called after each advance, synchronously on the advancing goroutine,
	// with the new frontier; calls to one fn never overlap and their
	// arguments strictly increase (an advance overtaken by a later one may be
	// skipped, never the latest).
	//
	// Caller's contract: fn must be fast and must not block (mark work and
	// ring a doorbell); it must not advance the store or call its own cancel,
	// which would deadlock. It may call the store's read methods.
	//
	// The returned cancel unregisters fn: after cancel returns, fn is never
	// called again, even if an advance runs concurrently (cancel waits for a
	// running call of fn to finish). cancel is idempotent. A nil fn registers
	// nothing and gets a no-op cancel.
	Subscribe(fn func(resolvedTs common.Ts)) (cancel func())
}

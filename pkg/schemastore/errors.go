package schemastore

import "errors"

// Sentinel errors. Every error the package returns wraps one of these.
var (
	// ErrInvalidOptions: MemoryOptions failed validation.
	ErrInvalidOptions = errors.New("schemastore: invalid options")
	// ErrInvalidDDL: a DDL with a negative table ID or a zero commit-ts.
	ErrInvalidDDL = errors.New("schemastore: invalid DDL")
	// ErrDDLBeforeFrontier: a DDL whose commit-ts is at or below the
	// resolved-ts; the history there is already promised complete.
	ErrDDLBeforeFrontier = errors.New("schemastore: DDL commit-ts at or below resolved-ts")
	// ErrDuplicateDDL: a second DDL for the same table and commit-ts.
	ErrDuplicateDDL = errors.New("schemastore: duplicate DDL")
	// ErrResolvedTsRegressed: an advance to a resolved-ts below the current one.
	ErrResolvedTsRegressed = errors.New("schemastore: resolved-ts regressed")
	// ErrInvalidRange: a range whose start is after its end, or a negative
	// table ID in a read or GC.
	ErrInvalidRange = errors.New("schemastore: invalid range")
	// ErrRangeAboveResolved: a range ending above the resolved-ts, where the
	// history is not complete yet.
	ErrRangeAboveResolved = errors.New("schemastore: range ends above resolved-ts")
	// ErrRangeTruncated: a range starting below the table's GC point, whose
	// DDLs may already be forgotten.
	ErrRangeTruncated = errors.New("schemastore: range starts below GC point")
)

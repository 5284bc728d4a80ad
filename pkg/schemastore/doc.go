// Package schemastore defines the schema-history interface the event service
// needs (Store) and an in-memory implementation (Memory) that tests and the
// demo server drive.
//
// A schema store knows the DDL history of every table up to a frontier, its
// resolved-ts: every DDL with commit-ts <= ResolvedTs() is known, and no DDL
// with commit-ts <= ResolvedTs() will ever be added later. The event service
// must never deliver rows beyond that frontier, because decoding a row at
// commit-ts T needs the schema at T and the DDLs ordered around T.
//
// Invariants:
//   - The frontier never moves backwards. Advancing it to its current value is
//     a no-op and notifies nobody.
//   - A DDL is accepted only above the current frontier; once the frontier
//     passes it, the history at and below the frontier is immutable (except
//     for GC, which only forgets DDLs at or below a caller's checkpoint).
//   - Reads never see a DDL above the frontier: TableState reports only DDLs
//     at or below it, and FetchDDLs refuses ranges ending above it.
//   - Subscribers are called synchronously on the advancing goroutine, with
//     no lock of the store held, in increasing frontier order per subscriber;
//     once a subscription's cancel returns, its callback never runs again.
//   - The package starts no goroutines and holds no package-level state.
//
// Every error wraps one of the sentinel errors in errors.go; test with
// errors.Is. Bad input returns an error, never panics.
package schemastore

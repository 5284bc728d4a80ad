// Package common holds the small value types every other package of the
// project shares: Ts (a TSO-style timestamp), Span (a table key range), Row
// (one row change) and DispatcherID.
//
// Invariants:
//   - Every type here is a plain value: no goroutines, no locks, no package
//     state. Methods never mutate their receiver's backing arrays.
//   - Ts orders exactly like the uint64 it wraps, and its physical part is
//     milliseconds since the Unix epoch, so lag is Physical(now) - Physical(ts).
//   - A Span is valid when Validate returns nil; functions that take spans from
//     outside the process validate them first and return ErrInvalidSpan.
//
// This package imports nothing of the project.
package common

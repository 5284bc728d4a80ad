// Package optcheck collects the problems of an options struct so that
// Validate methods report every bad field at once, each wrapping the
// package's sentinel error.
//
// Invariant: Err returns nil exactly when no problem was added; every
// error it returns satisfies errors.Is(err, sentinel).
package optcheck

// Package goruntime holds cdcserver's process-wide Go runtime settings
// (--gc-percent, --max-procs, --memory-limit): their flags, their checks,
// and Apply, which sets them while a command serves and returns what puts
// the previous ones back (commands run inside tests' own processes).
//
// Invariants: a set environment variable of the same setting (GOGC,
// GOMAXPROCS, GOMEMLIMIT) wins over its flag, so an operator's environment
// is never overridden; zero leaves the runtime's setting; restore undoes
// exactly what Apply changed.
package goruntime

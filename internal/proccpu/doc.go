// Package proccpu reads processes' CPU times from /proc (Linux): what a
// benchmark charges to a PostgreSQL server (a postmaster and its
// backends) or to a child process. It is a measuring kit for benchmarks
// and scripts, never linked by the library.
//
// Invariants: it only reads /proc, never signals or changes a process,
// and holds no state. Times are whole clock ticks (10 ms); Tree counts
// the root and its direct children only, and a child that exits between
// the reads is missed or counted once, never twice.
package proccpu

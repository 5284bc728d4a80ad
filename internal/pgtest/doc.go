// Package pgtest starts a real PostgreSQL server for tests: initdb and
// postgres from the machine's PostgreSQL 15 packages, as a non-root user
// (the packages' "postgres" user when the test runs as root), on a free
// loopback port (below the ephemeral range; another one when a parallel
// server takes it first), in a temporary directory that is removed when
// the test ends. A test that cannot start the server fails; it never
// skips.
//
// StartWith takes Options: wal_level=logical for replication sources,
// fsync on for benchmarks; Stop and Restart take a server down and back
// on the same address; Launch starts one outside a test. Options.Locales
// compiles locales for a server of its own (localedef into its directory,
// LOCPATH in its environment): the machine has only C and POSIX.
//
// StartProxy puts a loopback TCP proxy in front of a server that can delay
// traffic (a slow link) and reset every connection (a network fault).
//
// Invariants: every server Start creates is stopped (pg_ctl stop -m
// immediate) and its directory removed by the test's cleanup; nothing is
// shared between tests or left behind.
package pgtest

// Command pgshutdown measures how long a shutdown of a PostgreSQL source
// takes with a changefeed connected: `cdcserver serve`, and PostgreSQL's
// native logical replication (a subscription) for comparison, on fresh
// PostgreSQL 15 servers (internal/pgtest): a smart and a fast shutdown while
// the changefeed idles, and a fast one under a write load with a
// transaction left open. A walsender at shutdown waits until its client
// confirms everything it sent, and a smart shutdown waits for every regular
// client, so a changefeed can hold a source's shutdown for as long as it
// runs; each shutdown here is bounded by -limit and reported as such.
// `make pgshutdown` prints the table and writes it into docs/benchmarks.md
// (-update).
//
// Invariants: every server it starts is stopped and removed when it
// ends; a shutdown that passes -limit is reported as "> limit", never as
// a figure; nothing is measured while a changefeed has not replicated.
package main

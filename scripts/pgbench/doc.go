// Command pgbench measures `cdcserver serve` side by side with PostgreSQL's
// native logical replication (a publication FOR ALL TABLES and a
// subscription, PostgreSQL 15 to PostgreSQL 15) under the same load, on
// fresh servers (internal/pgtest, fsync on) for each configuration:
//
//   - none: the load alone, no replication (the baseline);
//   - native: CREATE SUBSCRIPTION on the target, the tables created there
//     first;
//   - cdcflow: a `cdcserver serve --sink-workers 4` child process.
//
// The load: -rows rows in 4-row transactions (75% inserts, 20% updates,
// 5% deletes) from -clients pgx connections, flat out, over -tables
// tables, plus a probe row (id, clock_timestamp()) every 100 ms. For each
// configuration it reports the source's commit rows/s, the lag (now minus
// the newest probe the target holds, polled every 100 ms while the load
// runs), the catch-up after the load (until the target holds a fence
// row in every table and the last probe), the drain of a -backlog rows
// backlog loaded while the changefeed was stopped (native: ALTER
// SUBSCRIPTION DISABLE/ENABLE; cdcflow: SIGTERM, start again), and
// whether `cdcserver compare` found the tables equal at the end.
//
// Usage: go run ./scripts/pgbench [-update] [-runs N] [-rows N] ...
//
// It prints a table of medians over -runs runs; -update also writes it
// into docs/benchmarks.md between <!-- pgbench:table --> and
// <!-- /pgbench:table -->. It is never run by `make test`.
//
// Invariants: each configuration runs on servers launched for it alone
// and closed (stopped, their directories removed) when it ends, its
// cdcserver child stopped first; a failure is recorded in that
// configuration's row and printed under the table, never dropped, and the
// remaining configurations still run; -update rewrites only the
// pgbench:table block of -doc.
package main

// Package upstream provides the synthetic and test sources that feed the
// event store through eventstore.Upstream (the synthetic server, tests and
// benchmarks use them; nothing of production does, and what every
// upstream needs to make a subscription's Close final, SinkGuard, is
// eventstore's):
//
//   - Manual, for tests: it records subscriptions and pushes exactly the
//     batches a test hands it (valid or not), and lets tests make Subscribe
//     fail and wait for subscriptions without sleeping.
//   - Generator, a synthetic workload (tables, rows/s, transaction size, row
//     size, hot-table skew) that is seeded and deterministic, and doubles as
//     the oracle (Rows) that verification and crash/restart tests compare
//     the delivered data against.
//
// # Determinism contract
//
// Time is cut into ticks of Tick (a whole number of milliseconds): tick k
// holds the timestamps whose physical part lies in [k*Tick, (k+1)*Tick), in
// milliseconds since the Unix epoch. The rows of table T in tick k are a pure
// function of (Seed, T, k) and the other options (after defaults): each
// (Seed, T, k) seeds its own PRNG from a hash of the three, so the rows do
// not depend on when, how often or in which order they are asked for, on any
// subscription's start-ts, or on other tables. StartTs and EndTs only cut:
// the workload is the rows with commit-ts in (StartTs, EndTs].
//
// Within a tick, table T writes n transactions. Let e be its expected count
// (RowsPerSec*Tick/TxnRows times the table's share). A dense table (e >= 1)
// writes the integer part of e plus one with probability equal to the
// fractional part. A sparse table (e < 1) writes one transaction in a tick
// with probability e, independently per tick; the ticks with a transaction
// are drawn as geometric gaps, block by block (block b holds ceil(1/e)
// ticks, at most 65,536, and is seeded by (Seed, T, b)), which is the same
// process but lets the next tick with rows be found in O(1 + blocks
// skipped): Rows, RowCount and the driver cost what the rows cost, not the
// number of ticks, which is what a million mostly idle tables need. Either
// way long-run rates match RowsPerSec and HotFraction. Every transaction has exactly TxnRows
// rows with distinct keys; transaction j (from 0) has start-ts base+1+j, and
// transactions are grouped, in order, into groups of 1..TxnsPerCommitTs that
// share a commit-ts: group i commits at base+n+1+i, where base is the tick's
// first timestamp, ComposeTs(k*Tick in ms, 0); base+x is ComposeTs of the
// same millisecond with logical counter x while x < 2^18, carrying into the
// tick's next milliseconds beyond that. So start-ts < commit-ts, commit-ts increases within the
// tick, and every timestamp of the tick stays inside it. Keys are 8-byte
// big-endian numbers in [0, KeysPerTable), so later transactions update and
// delete earlier keys; no two rows of one commit-ts share a key. About 10% of
// rows are deletes (no value); puts carry RowBytes deterministic bytes and no
// old value. Rows are ordered by (commit-ts, start-ts, key), and the rows of
// a transaction are contiguous.
//
// # Feeding invariants
//
//   - Subscribe never calls the sink; only the Generator's driver goroutine
//     (started by Start, stopped by Close) or Manual.Push do.
//   - After a Subscription's Close returns, its sink is never called again.
//   - The Generator's frontier F is the end of the last fully elapsed tick
//     (the next tick's first timestamp minus one), capped at EndTs. It only
//     grows, even if the clock moves back. The driver wakes at the wall
//     clock's tick boundaries, when F can move, and gives each new F to
//     OnFrontier before any subscription receives a row or a resolved-ts
//     above it.
//   - A Generator subscription receives exactly the rows of its span with
//     commit-ts in (startTs, F], in order, each once, in batches of at most
//     PushRowsMax rows; the batch that completes them carries ResolvedTs F.
//     A failed push is retried from the last accepted position, at the
//     driver's next pass (a tick boundary, or a new subscription's kick),
//     also once F has stopped at EndTs. When a subscription's due work is
//     only the advance to F (no rows in range), the advances of a round go
//     together in one eventstore.PushResolvedGuarded call (which holds
//     each subscription's eventstore.SinkGuard for the call, as Push
//     does); one subscription's Close cancels the call for all, and only
//     the closed one stops: the others are retried at the next pass
//     (TestGeneratorRetriesTheFinalAdvanceAfterAnotherSubscriptionsClose).
//
// Nothing here has package-level mutable state; clock and logger come in
// through GeneratorOptions.
package upstream

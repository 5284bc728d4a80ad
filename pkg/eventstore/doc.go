// Package eventstore is the pebble-backed event store a changefeed server
// embeds: it subscribes table spans at an Upstream, commits the rows it is
// fed, and tells registered dispatchers how far their span is complete.
//
// Data flow: the upstream pushes Batches into a per-subscription Sink; Push
// validates them and queues them to the subscription's write worker (a fixed
// pool, hashed by subscription). A worker commits a pebble batch and only
// then advances the subscription's resolved-ts and calls the notifiers of its
// dispatchers. Iterators read a dispatcher's rows in (commit-ts, start-ts,
// row key) order. An Upstream keeps its side of the Subscription contract
// (no sink call once Close returned) with a SinkGuard per subscription, and
// advances many at once with PushResolvedGuarded (sinkguard.go).
//
// Invariants:
//   - Notify after commit: when a notifier is called with resolved-ts R,
//     every row of the span with commit-ts <= R is readable (from pebble or
//     from the fresh rows, whichever serves the dispatcher's scans).
//   - Per dispatcher, notifications are serialised, strictly increasing and
//     above the dispatcher's start-ts (edge-triggered); none is delivered
//     after UnregisterDispatcher or Close returned. A slow notifier slows
//     only the write worker calling it; it never breaks an invariant.
//   - A row with commit-ts at or below the subscription's resolved-ts, a
//     regressing resolved-ts, a row outside the span or a malformed row is
//     refused with a typed error and counted; the rest of the batch is kept.
//   - Dispatchers with an identical span share one subscription as long as it
//     still holds every row above their start-ts; the last unregistration
//     ends the subscription after IdleTTL and deletes its rows.
//   - GC deletes only rows with commit-ts strictly below the minimum
//     checkpoint of a subscription's dispatchers; an iterator may not start
//     below its dispatcher's checkpoint or end above the resolved-ts, so it
//     never observes a deleted or incomplete range.
//   - Fresh rows: every committed row of a subscription above its fresh
//     floor is also held in memory (bounded per subscription and store-wide),
//     and an iterator whose range starts at or above that floor is served
//     from them with exactly the rows, order and transaction starts a pebble
//     iterator would give (fresh.go).
//   - Write-behind: a subscription whose fresh floor is at or below its
//     minimum checkpoint is scanned from memory only, so its rows are kept
//     there only; every row held only in memory is written to pebble before
//     the floor moves above the minimum checkpoint, so any scan that reads
//     pebble finds every row above the checkpoints there (fresh.go).
//   - The store is a cache: the upstream is the source of truth. An on-disk
//     directory is wiped at Open, and the WAL is off.
//   - Close stops notifications, ends upstream feeds, waits for the write
//     workers and the maintenance loop, then closes pebble. No goroutine
//     survives it; every call after it returns ErrClosed.
//
// Key layout: subscription ID, commit-ts, start-ts, row key (see codec.go);
// flags live in the value header.
package eventstore

// Package pgnotify publishes PostgreSQL NOTIFY messages without ever
// blocking the producer: seed 001's problem (Flyte's state service behind a
// blocking 256-slot FIFO and one pg_notify per round trip) solved with
// pkg/pendingset. Publish records the newest payload per (channel, key) and
// returns; the pendingset pump sends each drained batch as one statement,
//
//	SELECT pg_notify(c, p) FROM unnest($1::text[], $2::text[]) AS t(c, p)
//
// so throughput is a batch per round trip, not a payload per round trip.
//
// Invariants:
//   - Publish never blocks and never waits for the database; it fails only
//     for input PostgreSQL would reject (ErrPayloadTooLarge: a payload of
//     8000 bytes or more; ErrInvalidChannel) or after Close (ErrClosed).
//   - Memory is bounded by the number of distinct (channel, key) pairs
//     pending, whatever the publish rate: repeated publishes coalesce, the
//     newest payload wins.
//   - Nothing accepted is lost while the process runs: a failed statement
//     (connection lost, server restarting) keeps its batch, which is retried
//     after the pump's back-off on a new connection. A batch PostgreSQL
//     rejects as a whole for a bad entry is bisected until the entry stands
//     alone (pendingset.Permanent) and quarantined; the rest is delivered.
//   - NOTIFY is not durable: a listener that was disconnected misses what
//     was sent meanwhile and must re-read the state it follows.
//
// Goroutines are started by Start (the pump's) and ended by Close. Logger,
// Registerer and Clock come in through Options.
package pgnotify

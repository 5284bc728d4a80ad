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
//     for input a UTF8 database would reject (ErrPayloadTooLarge: a
//     payload of 8000 bytes or more; ErrInvalidPayload: a NUL byte or
//     invalid UTF-8 in it; ErrInvalidChannel) or after Close (ErrClosed).
//   - Memory is bounded by the number of distinct (channel, key) pairs
//     pending, whatever the publish rate: repeated publishes coalesce, the
//     newest payload wins.
//   - Nothing accepted is lost while the process runs: a failed statement
//     (connection lost, server restarting) keeps its batch, which is retried
//     after the pump's back-off on a new connection. A batch PostgreSQL
//     refuses for its data (SQLSTATE class 22: what Publish cannot foresee,
//     such as a character the database's encoding lacks) is bisected at
//     once (pendingset.Permanent) and the rest delivered; the entry that is
//     refused on its own is dropped, counted and logged, since retrying the
//     same values fails the same way.
//   - NOTIFY is not durable: a listener that was disconnected misses what
//     was sent meanwhile and must re-read the state it follows.
//
// Goroutines are started by Start (the pump's) and ended by Close. Logger,
// Registerer and Clock come in through Options.
package pgnotify

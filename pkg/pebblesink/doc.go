// Package pebblesink is a durable eventcollector.Sink on pebble: the
// downstream of cdcserver's crash, restart and table-move runs, where the
// memory sink (eventcollector.MemorySink) would forget everything a process
// kill takes with it. It behaves as a real downstream database should, and
// the verifier reads it back to check the stream's guarantees.
//
// Invariants:
//   - A dispatcher's rows and DDLs are persisted together with its
//     checkpoint, in one atomic pebble batch written at Checkpoint; until
//     then they are held in memory and a crash loses them with the
//     checkpoint, so a restart resumes exactly after what was persisted.
//   - Row versions apply idempotently by (table, key, commit-ts): a
//     re-delivery keeps the sequence number of its first application, so
//     per-key order can be checked across restarts (a version with a higher
//     commit-ts was applied later).
//   - Keys are stored escaped, order-preserving and prefix-free, so one
//     key's versions are contiguous in a table's scan; the layout is
//     versioned, and a directory of another layout is refused
//     (ErrSinkFormat), a stored entry that does not decode reported
//     (ErrCorruptSink), a negative table refused (ErrInvalidTable), a
//     checkpoint of a dispatcher never bound refused (ErrNotBound).
//   - No goroutine is started; Close closes pebble.
package pebblesink

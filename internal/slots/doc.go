// Package slots gives items small dense indexes: the slot a dispatcher's
// registration carries so that the other side of the wire finds it by
// index instead of by a map probe on its 16-byte ID (the collector's slots,
// echoed in resolved-ts; the service's, echoed in heartbeats).
//
// Invariants: slot 0 is never given (zero means none); a freed slot is
// given again before the table grows, so the table is as long as the most
// items held at once, plus one; Free of a slot another item holds now is a
// no-op. A slot read from a peer is a hint: Get returns whatever holds it,
// and the caller checks that it is the item the peer named. The table does
// no locking (its owner's lock guards it) and holds no package state.
// A Map maps keys to slots, its buckets holding a fingerprint and a slot
// and no key: every key it maps is the key of the item in its slot (the
// owner's keyAt answers it), each probe run ends at an empty bucket
// (removal shifts back, no tombstones), it is at most three quarters
// full, and its hash is seeded per map. An Index is a Map over its own
// Table: the key and the item of a slot agree (Add maps both, Remove
// frees both), and a GC cycle does not trace either.
package slots

// Package pendingset is a coalescing pending set and the pump that drains
// it: the replacement for a blocking FIFO between producers that must never
// wait and a slow, fallible delivery path (seed 001, Flyte #7757). It is
// generic and imports nothing of the project but pkg/clock (the module's
// one clock) and internal/backoff (its one back-off).
//
// A Set[K, V] holds at most one undelivered value per key; Add merges a new
// value into it with Options.Merge. A capacity-one doorbell tells the
// consumer that something is ready. The consumer (a Pump, or any caller of
// Drain and Complete) takes bounded batches in the order keys became
// pending, delivers them, and reports the outcome; keys stay in the set
// until their delivery succeeds.
//
// Invariants:
//   - Add never blocks on a consumer, takes no context, never fails, is
//     O(1), and allocates nothing when the key is already held.
//   - Memory is bounded by the peak number of distinct keys held at once,
//     whatever the add rate: one slot (hot: key, value, state), one node
//     (cold bookkeeping), one 8-byte entry of the set's own hash index (at
//     most 7/8 full) and one FIFO ring position per key. A delivered key
//     keeps its slot (idle, not counted by Len) until a new key needs its
//     node, so adding it again is an index hit, not an insert. An Add to a
//     held key touches one index entry and its slot, not its node.
//   - No key is lost: a key leaves the set only when a delivery of its
//     newest value succeeded (or a newer value is queued again). For every
//     key, a delivery that starts after its last Add carries a value that
//     includes that Add.
//   - A key is never in two batches at once. An Add while its value is in
//     flight causes exactly one more delivery after Complete, not one per
//     Add.
//   - With Options.Supersedes, newest wins across deliveries too: a value
//     added after (or while) a newer one was delivered is dropped, not
//     delivered after it.
//   - A failed delivery merges back idempotently: the retried value is
//     Merge(failed, added meanwhile), so a retry neither duplicates nor
//     loses a newer value.
//   - Whole-batch failures spend no per-key budget; per-key failures spend
//     one attempt each. A whole-batch failure that wraps ErrPermanent, or
//     the Options.BisectAfter-th in a row (ErrBusy excepted), is not
//     retried whole: the pump bisects the batch until the failing entries
//     stand alone, so one bad key cannot wedge the pump. The attempt count survives merges and adds and is
//     reset only by success. After MaxAttempts a key is quarantined, never
//     dropped: counted, listed by QuarantinedKeys, and re-admitted every
//     QuarantineRetry for one more attempt.
//   - The Set starts no goroutine and arms no timer. Only Pump.Start starts
//     a goroutine (exactly one; with Options.MaxInFlight n > 1 it starts one
//     per batch in flight, at most n at once, which deliver concurrently
//     with disjoint keys); Stop and Drain end them all.
//   - Nothing is global: metrics go to the Registerer in Options, never
//     with a key as a label value; the logger and the clock are injected.
//
// Backoff and fresh adds. A key that failed on its own waits
// BackoffBase*2^(n-1) (capped at BackoffMax, shortened by up to Jitter).
// By default a fresh Add does not cut that wait short: the new value merges
// into the waiting one, and the newest value goes out when the delay ends.
// Backoff here is per key, so other keys, new or old, are never held up by
// it; and if every add released a backing-off key, a hot key (resolved-ts
// advances many times a second) would spend its whole budget at the add
// rate and be quarantined within milliseconds of a short per-key refusal.
// When the domain knows a fresh value can cure the failure (a new epoch,
// say), Options.Bypass lets it release the key at once, attempts kept.
// Quarantine is never bypassed.
//
// Shutdown. Pump.Stop stops now: it cancels an in-flight delivery (whose
// batch merges back) and leaves queued keys in the set. Pump.Drain waits
// for queued and in-flight keys, and those added meanwhile, to be
// delivered, bounded by its context (unlike client-go's drain, which
// forgets queued items). Add keeps working after either; it just records.
//
// Test support: clock.Fake (package pkg/clock, the module's one clock) drives
// Options.Clock in tests. The key's state machine is traced step by step by
// the datadriven scripts in testdata/trace (TestTraces).
package pendingset

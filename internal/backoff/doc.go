// Package backoff is the module's one back-off: the delay before retrying
// something that failed n times in a row. Every retry loop of the module
// (the event service's sends and store re-registrations, the pending set's
// keys and pump, the PostgreSQL source's stream and copies, the sink's
// lanes, the NOTIFY listener, the remote client's stream, the cdcserver
// collector's registrations and copies of joined tables) computes its delay
// here, and only its delay: when to reset, and what clock or timer to wait
// on, stay with the caller.
//
// Invariants:
//   - Delay(n, base, max, jitter, u) is pure: the n-th consecutive failure
//     (1-based) waits base*2^(n-1), capped at max, then shortened by the
//     fraction jitter*u. n <= 0 counts as the first failure (base).
//   - The result lies in [d*(1-jitter), d] for that capped d, so it is never
//     negative and never above max (nor above base for n <= 1): jitter only
//     shortens. jitter is clamped to [0,1] (NaN: 0); a u outside [0,1) or
//     NaN counts as 0 (no shortening). A base or max <= 0 gives 0.
//   - No overflow for any n, base or max (up to math.MaxInt64), and the
//     work is O(log(max/base)), at most 63 doublings, whatever n is.
//   - The package starts no goroutine, arms no timer and holds no mutable
//     package-level state. Backoff, the stateful helper, draws u from its
//     own Rand (default math/rand/v2.Float64, which is safe for concurrent
//     use) and only when its Jitter is above 0, so a Backoff without
//     jitter is deterministic; a Backoff is not safe for concurrent use.
package backoff

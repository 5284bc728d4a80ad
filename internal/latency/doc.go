// Package latency is a small lock-free log-linear histogram for nanosecond
// durations, used where a quantile (p50, p99, p99.9) or the exact maximum is
// reported: the notify callback duration, benchmark tails, resolved-ts lag.
//
// Invariants: Record is wait-free (atomic adds only) and allocation-free;
// a value is counted in the bucket whose range contains it, and bucket
// ranges have a relative width of at most 1/subBuckets (12.5%), so a
// reported quantile is within 12.5% above the true one. Max is exact.
package latency

// Package promutil registers groups of Prometheus collectors on an
// injected Registerer, all or none, and reads a metric's value back from
// a Gatherer (Sum, for tests that check what was counted).
//
// Invariant: RegisterAll either registers every collector or leaves the
// registerer as it found it; a nil registerer registers nothing.
package promutil

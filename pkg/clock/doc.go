// Package clock is the module's one time source: the Clock interface every
// component takes in its options (eventstore, eventservice, eventcollector,
// upstream, pendingset, pgsource, pgsink), the real clock, Fake, a manually
// advanced clock for tests, and Stopwatch, RealDeadline and RealSleep for
// the things that must count real time whatever the clock (a latency
// metric; an operating-system deadline; a wait for a socket's receive
// queue to fill). Nothing else in pkg/ reads the wall clock
// (tests/hygiene_test.go). It is a leaf: it imports only the standard
// library, so any package may depend on it, pendingset included.
//
// Invariants: Real is stateless. Fake moves only in Advance and Set, fires
// timers and tickers only there (or, for a timer of d <= 0, when it is
// created), on the caller's goroutine, and never blocks doing so: every
// timer and ticker has a one-slot channel and a tick is dropped when one is
// already pending, like time.Ticker. Nothing here is package-level state.
package clock

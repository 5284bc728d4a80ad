// Package testwait is the tests' one way to wait for a condition that
// signals no change: For (and Within, Until) poll it until it holds, with
// a deadline. The deadline only bounds a failing test: what a test asserts
// is the condition, never the time it took, and nothing is ordered by a
// sleep.
//
// A condition that a component signals (a channel, a knob, a checker's
// change notification) is waited on through that signal instead; testwait
// is for state read from outside (metrics, stats, another process, a
// database).
//
// Invariants:
//   - cond runs on the caller's goroutine, first at once and then after
//     each poll interval (1ms, doubling to 20ms), never after the wait
//     returned; it may call t.Fatal (For and Within run on the test's
//     goroutine).
//   - For and Within return only once cond returned true, or fail t
//     ("timed out after D waiting for: what"); Until reports which.
//   - The package starts no goroutine and leaves no timer behind.
//
// It is a test kit: tests import it, the library never does
// (tests/deps_test.go).
package testwait

package testwait

import (
	"testing"
	"time"
)

// DefaultTimeout bounds For: generous, since it fires only in a failing
// (hung) test, on a loaded machine or under -race.
const DefaultTimeout = time.Minute

// The poll interval: first pollMin, doubling up to pollMax, so that a
// condition that holds soon is seen soon and a slow one (another
// process's state, a database's) is not polled in a tight loop.
const (
	pollMin = time.Millisecond
	pollMax = 20 * time.Millisecond
)

// For polls cond until it holds; after DefaultTimeout it fails t with
// "timed out after 1m0s waiting for: what".
func For(t testing.TB, what string, cond func() bool) {
	t.Helper()
	Within(t, DefaultTimeout, what, cond)
}

// Within is For with a timeout of the caller's.
func Within(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Until(timeout, cond) {
		t.Fatalf("timed out after %v waiting for: %s", timeout, what)
	}
}

// Until polls cond until it holds, and reports whether it did before
// timeout passed. It fails nothing, so a goroutine other than the test's
// (which may not call t.Fatal) can wait with it and report its own error.
func Until(timeout time.Duration, cond func() bool) bool {
	if cond() {
		return true
	}
	deadline := time.Now().Add(timeout)
	poll := time.NewTimer(pollMin)
	defer poll.Stop()
	for interval := pollMin; ; interval = min(2*interval, pollMax) {
		<-poll.C // polling a condition with a deadline, not ordering
		if cond() {
			return true
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		poll.Reset(min(2*interval, pollMax, left))
	}
}

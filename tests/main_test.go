package tests

import (
	"runtime"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives the tests: every
// scenario closes what it started, and Close must leave nothing behind
// (guarantee 8). No goroutine is ignored.
//
// It also samples the heap every 16 KiB allocated (the runtime's default
// is 512 KiB), before anything is allocated: TestBoundedMemoryUnderCongestion
// estimates the storage's share of the live heap from the sampled profile,
// and at the default rate the generator's 200-byte rows were sampled about
// once in 2600, so the estimate moved by several MiB from one reading to the
// next (-10 to +9 MiB of "growth" over 18 runs, against a bound of 6) and
// the test failed by chance on a loaded machine.
func TestMain(m *testing.M) {
	runtime.MemProfileRate = 16 << 10
	goleak.VerifyTestMain(m)
}

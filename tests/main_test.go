package tests

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package if any goroutine outlives the tests: every
// scenario closes what it started, and Close must leave nothing behind
// (guarantee 8). No goroutine is ignored.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

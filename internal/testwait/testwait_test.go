package testwait

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A condition that holds at once is checked once, and no timer is armed.
func TestAConditionThatHoldsReturnsAtOnce(t *testing.T) {
	calls := 0
	For(t, "at once", func() bool { calls++; return true })
	require.Equal(t, 1, calls)
}

// A condition that comes to hold is polled until it does, and not after.
func TestPollsUntilTheConditionHolds(t *testing.T) {
	calls := 0
	Within(t, DefaultTimeout, "the fourth poll", func() bool { calls++; return calls == 4 })
	require.Equal(t, 4, calls)
}

// Until reports a condition that never holds once the timeout passed, and
// For fails the test naming what it waited for.
func TestATimeoutFails(t *testing.T) {
	require.False(t, Until(10*time.Millisecond, func() bool { return false }))
	ft := &fakeT{}
	func() {
		defer func() { _ = recover() }()
		Within(ft, 10*time.Millisecond, "godot", func() bool { return false })
	}()
	require.Equal(t, "timed out after 10ms waiting for: godot", ft.msg)
}

// fakeT records a Fatalf, as testing.T's would, and stops the caller.
type fakeT struct {
	testing.TB
	msg string
}

func (f *fakeT) Helper() {}

func (f *fakeT) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic("fatal")
}

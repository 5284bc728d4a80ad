package pendingsettest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)

func fired(c <-chan time.Time) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func TestFakeClockTimers(t *testing.T) {
	c := NewFakeClock(t0)
	require.Equal(t, t0, c.Now())
	a, _ := c.NewTimer(10 * time.Millisecond)
	b, stopB := c.NewTimer(5 * time.Millisecond)
	z, stopZ := c.NewTimer(0)
	require.True(t, fired(z), "d <= 0 fires at once")
	require.False(t, stopZ())
	require.Equal(t, 2, c.Timers())
	next, ok := c.NextTimer()
	require.True(t, ok)
	require.Equal(t, 5*time.Millisecond, next)

	c.Advance(5*time.Millisecond - 1)
	require.False(t, fired(a))
	require.False(t, fired(b))
	c.Advance(1)
	require.False(t, fired(a))
	require.True(t, fired(b))
	require.False(t, stopB(), "already fired")
	require.Equal(t, t0.Add(5*time.Millisecond), c.Now())

	d, stopD := c.NewTimer(time.Hour)
	require.True(t, stopD())
	require.False(t, stopD())
	c.Advance(2 * time.Hour)
	require.True(t, fired(a))
	require.False(t, fired(d), "stopped timers never fire")
	_, ok = c.NextTimer()
	require.False(t, ok)
}

func TestFakeClockWaitTimers(t *testing.T) {
	c := NewFakeClock(t0)
	armed := make(chan (<-chan time.Time))
	go func() {
		ch, _ := c.NewTimer(time.Second)
		armed <- ch
	}()
	require.NoError(t, c.WaitTimers(context.Background(), 1))
	c.Advance(time.Second)
	require.True(t, fired(<-armed))

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, c.WaitTimers(ctx, 1), context.Canceled)
}

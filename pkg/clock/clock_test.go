package clock

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var start = time.Unix(1000, 0)

func fired(c <-chan time.Time) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func TestFakeTickerAndTimer(t *testing.T) {
	f := NewFake(start)
	tk := f.NewTicker(10 * time.Millisecond)
	tm := f.NewTimer(25 * time.Millisecond)
	require.Equal(t, 2, f.Waiters())

	f.Advance(9 * time.Millisecond)
	require.False(t, fired(tk.C()), "ticker fired early")
	f.Advance(time.Millisecond)
	require.Equal(t, start.Add(10*time.Millisecond), <-tk.C())

	f.Advance(20 * time.Millisecond) // ticks at 20 and 30 coalesce into one pending tick
	require.Equal(t, start.Add(20*time.Millisecond), <-tk.C())
	require.Equal(t, start.Add(25*time.Millisecond), <-tm.C())
	require.Equal(t, 1, f.Waiters(), "a fired timer is disarmed")

	tm.Reset(5 * time.Millisecond)
	f.Advance(5 * time.Millisecond)
	require.Equal(t, start.Add(35*time.Millisecond), <-tm.C())
	tk.Stop()
	require.False(t, tm.Stop(), "already fired")
	require.Zero(t, f.Waiters())
	require.Equal(t, start.Add(35*time.Millisecond), f.Now())
}

func TestFakeTimerEdges(t *testing.T) {
	f := NewFake(start)
	a := f.NewTimer(10 * time.Millisecond)
	b := f.NewTimer(5 * time.Millisecond)
	z := f.NewTimer(0)
	require.True(t, fired(z.C()), "d <= 0 fires at once")
	require.False(t, z.Stop())
	require.Equal(t, 2, f.Waiters())
	next, ok := f.NextDue()
	require.True(t, ok)
	require.Equal(t, 5*time.Millisecond, next)

	f.Advance(5*time.Millisecond - 1)
	require.False(t, fired(a.C()))
	require.False(t, fired(b.C()))
	f.Advance(1)
	require.False(t, fired(a.C()))
	require.True(t, fired(b.C()))

	d := f.NewTimer(time.Hour)
	require.True(t, d.Stop())
	require.False(t, d.Stop())
	f.Advance(2 * time.Hour)
	require.True(t, fired(a.C()))
	require.False(t, fired(d.C()), "stopped timers never fire")
	_, ok = f.NextDue()
	require.False(t, ok)
}

func TestFakeSetJumpsTheWallClockOnly(t *testing.T) {
	f := NewFake(start)
	tk := f.NewTicker(10 * time.Millisecond)
	f.Advance(4 * time.Millisecond)
	f.Set(start.Add(-time.Hour)) // back: nothing fires, the deadline stays 6ms away
	require.False(t, fired(tk.C()))
	require.Equal(t, start.Add(-time.Hour), f.Now())
	next, _ := f.NextDue()
	require.Equal(t, 6*time.Millisecond, next)
	f.Set(start.Add(time.Hour)) // forward: nothing fires either
	require.False(t, fired(tk.C()))
	f.Advance(6 * time.Millisecond)
	require.Equal(t, start.Add(time.Hour+6*time.Millisecond), <-tk.C(), "ticks carry the wall reading")
	tk.Stop()
}

func TestFakeWaitWaiters(t *testing.T) {
	f := NewFake(start)
	armed := make(chan Timer)
	go func() { armed <- f.NewTimer(time.Second) }()
	require.NoError(t, f.WaitWaiters(context.Background(), 1))
	f.Advance(time.Second)
	require.True(t, fired((<-armed).C()))

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, f.WaitWaiters(ctx, 1), context.Canceled)
}

func TestRealClock(t *testing.T) {
	c := OrReal(nil)
	require.IsType(t, Real{}, c)
	tm := c.NewTimer(time.Millisecond)
	<-tm.C()
	tm.Stop()
	tk := c.NewTicker(time.Millisecond)
	<-tk.C()
	tk.Stop()
	require.False(t, c.Now().IsZero())
	f := NewFake(start)
	require.Same(t, f, OrReal(f))
}

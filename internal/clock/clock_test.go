package clock

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestFakeTickerAndTimer(t *testing.T) {
	start := time.Unix(1000, 0)
	f := NewFake(start)
	tk := f.NewTicker(10 * time.Millisecond)
	tm := f.NewTimer(25 * time.Millisecond)
	require.Equal(t, 2, f.Waiters())

	f.Advance(9 * time.Millisecond)
	select {
	case <-tk.C():
		t.Fatal("ticker fired early")
	default:
	}
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
	tm.Stop()
	require.Zero(t, f.Waiters())
	require.Equal(t, start.Add(35*time.Millisecond), f.Now())
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
}

package remote

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/faultproxy"
	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// The liveness watchdogs: the server's stream handler's and the client's
// watch, told apart by the knob that wrapped their tickers.
const (
	serverWatchdog = "server"
	clientWatchdog = "client"
)

// watchdogClock is a clock.Fake that also tells when a liveness watchdog
// has judged the ticks it was given, so that a test advances the clock
// only once each watchdog is parked again: time then cannot move on while
// a watchdog is still to read it, and the test sees exactly what the
// watchdog concluded at each tick. The watchdogs' tickers reach it
// through the server's and the client's testingKnobs (knobs). A watchdog
// is parked when its select takes its ticker's channel (Ticker.C, called
// once per pass of its loop) and finds no tick pending after the clock's
// last advance: the tick was received and judged on the previous pass.
// Time moves only in advance.
type watchdogClock struct {
	*clock.Fake
	steps atomic.Int64 // advances done

	mu struct {
		sync.Mutex
		tickers []*watchedTicker
		changed chan struct{} // closed and replaced on every change below
	}
}

// watchedTicker is a watchdog's ticker of the fake clock, noting its
// owner and when its receiver came back to it.
type watchedTicker struct {
	clk    *watchdogClock
	inner  clock.Ticker
	owner  string // serverWatchdog or clientWatchdog
	period time.Duration
	born   time.Time
	// Under clk.mu: the step of the last C that found no tick pending
	// (-1: none yet), and whether it was stopped.
	parkedAt int64
	stopped  bool
}

func newWatchdogClock() *watchdogClock {
	c := &watchdogClock{Fake: clock.NewFake(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))}
	c.mu.changed = make(chan struct{})
	return c
}

func (c *watchdogClock) changedLocked() {
	close(c.mu.changed)
	c.mu.changed = make(chan struct{})
}

// knobs watch the watchdogs of the side named owner.
func (c *watchdogClock) knobs(owner string) testingKnobs {
	return testingKnobs{watchdog: func(inner clock.Ticker, period time.Duration) clock.Ticker {
		w := &watchedTicker{clk: c, inner: inner, owner: owner, period: period, born: c.Now(), parkedAt: -1}
		c.mu.Lock()
		defer c.mu.Unlock()
		c.mu.tickers = append(c.mu.tickers, w)
		c.changedLocked()
		return w
	}}
}

func (w *watchedTicker) C() <-chan time.Time {
	step := w.clk.steps.Load() // before looking at the channel: the advance's tick, if any, is in it already
	ch := w.inner.C()
	if len(ch) == 0 {
		w.clk.mu.Lock()
		w.parkedAt = step
		w.clk.changedLocked()
		w.clk.mu.Unlock()
	}
	return ch
}

func (w *watchedTicker) Stop() {
	w.inner.Stop()
	w.clk.mu.Lock()
	defer w.clk.mu.Unlock()
	w.stopped = true
	w.clk.changedLocked()
}

// await waits, without sleeping, until cond (called with c.mu held) holds.
func (c *watchdogClock) await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(30 * time.Second) // a deadline for a failing test, not ordering
	for {
		c.mu.Lock()
		ok, changed := cond(), c.mu.changed
		c.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("never: %s", what)
		}
	}
}

// watchdogs returns the running watchdog tickers created by owner.
// REQUIRES: c.mu held.
func (c *watchdogClock) watchdogsLocked(owner string) []*watchedTicker {
	var out []*watchedTicker
	for _, w := range c.mu.tickers {
		if w.owner == owner && !w.stopped {
			out = append(out, w)
		}
	}
	return out
}

// running reports how many of owner's watchdogs run.
func (c *watchdogClock) running(owner string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.watchdogsLocked(owner))
}

// advance moves the clock by d, then waits until every watchdog that got
// a tick in it has judged it: it is parked again, or it stopped (declared
// the link dead, or its stream ended). d must be shorter than the
// watchdogs' period, so that no tick is dropped.
func (c *watchdogClock) advance(t *testing.T, d time.Duration) {
	t.Helper()
	prev := c.Now()
	c.Fake.Advance(d)
	step := c.steps.Add(1)
	now := c.Now()
	c.await(t, "the watchdogs judged their ticks", func() bool {
		for _, w := range c.mu.tickers {
			ticked := now.Sub(w.born)/w.period > prev.Sub(w.born)/w.period
			if ticked && !w.stopped && w.parkedAt < step {
				return false
			}
		}
		return true
	})
}

// The liveness bound: once nothing arrives on a data stream, each side
// declares it dead no sooner than the liveness timeout L and no later than
// 4L/3 (its watchdog looks every L/3). Interleaving: the stream opens at
// fake time 0 (the last frame each side receives); a proxy then holds both
// directions, with a frame of the server's caught in it (so the server's
// closing the connection does not reach the client); the clock moves in
// steps of L/12, each once the watchdogs judged the ticks it gave them.
// Before L, both sides hold the link alive; at 4L/3, the server has
// declared it dead (Send is ErrUnavailable) and so has the client.
func TestADeadLinkIsDeclaredDeadWithinFourThirdsOfTheLivenessTimeout(t *testing.T) {
	const L = livenessForTest
	clk := newWatchdogClock()
	srv, addr, _ := serveWithKnobs(t, ServerOptions{Clock: clk, LivenessTimeout: L}, clk.knobs(serverWatchdog))
	proxy := faultproxy.Start(t, addr)
	cli, err := NewClient(ClientOptions{Addr: proxy.Addr, Target: "c1", Capacity: 8, Clock: clk, LivenessTimeout: L})
	require.NoError(t, err)
	cli.knobs = clk.knobs(clientWatchdog)
	require.NoError(t, cli.Start())
	defer cli.Close()
	waitConnected(t, srv, "c1")
	testwait.For(t, "the client's stream", func() bool { return cli.Streams() == 1 })
	clk.await(t, "both watchdogs run", func() bool {
		return len(clk.watchdogsLocked(serverWatchdog)) == 1 && len(clk.watchdogsLocked(clientWatchdog)) == 1
	})
	srv.mu.Lock()
	p := srv.mu.peers["c1"]
	srv.mu.Unlock()

	down := proxy.Hold(faultproxy.Downstream)
	proxy.Hold(faultproxy.Upstream)
	require.NoError(t, srv.Send("c1", sampleMessages()[:1]))
	<-down

	for step := 1; step <= 16; step++ {
		clk.advance(t, L/12)
		at := time.Duration(step) * L / 12
		switch {
		case at < L:
			require.True(t, p.alive(), "at %v: the server declared the link dead before %v", at, L)
			require.Equal(t, 1, clk.running(clientWatchdog), "at %v: the client declared the link dead before %v", at, L)
		case at == 4*L/3:
			require.False(t, p.alive(), "at %v: the server has not declared the link dead", at)
			require.ErrorIs(t, srv.Send("c1", sampleMessages()[:1]), messaging.ErrUnavailable)
			require.Equal(t, 1.0, testutil.ToFloat64(srv.met.deadLinks))
			require.Zero(t, clk.running(clientWatchdog), "at %v: the client has not declared the link dead", at)
		}
	}
	// The client's watchdog ended the stream as a dead link (not because
	// the stream failed otherwise): it counts it as it redials.
	testwait.For(t, "the client counted the dead link", func() bool { return testutil.ToFloat64(cli.met.deadLinks) == 1 })
}

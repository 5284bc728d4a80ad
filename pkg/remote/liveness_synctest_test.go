package remote

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// The client's side of the liveness bound, in pure Go: its watchdog and
// its pings run on real tickers (the default clock) inside a synctest
// bubble, whose time moves only when every goroutine in it is blocked, so
// each assertion sees exactly what the watchdog concluded at each tick.
// TestADeadLinkIsDeclaredDeadWithinFourThirdsOfTheLivenessTimeout checks
// both sides end to end over a real connection.

// bubbledClient is a Client with just what its watchdog and its grants'
// pings read, on the bubble's clock.
func bubbledClient(liveness time.Duration) *Client {
	return &Client{opts: ClientOptions{Addr: "-", Target: "c1", LivenessTimeout: liveness}.EnsureDefaults(), log: zap.NewNop()}
}

// A link on which nothing arrives is alive until the liveness timeout L
// and declared dead (the stream's context cancelled with errDeadLink) by
// 4L/3, the watchdog looking every L/3; one on which a frame arrives every
// L/2 stays alive; one whose write has blocked since it began is declared
// dead by 4L/3 even though frames arrive.
func TestTheClientsWatchdogBound(t *testing.T) {
	const L = DefaultLivenessTimeout
	for _, c := range []struct {
		name string
		// each runs every L/6 on the test's goroutine (tick: its count)
		step func(live *linkWatch, tick int)
		// deadBy is the first tick (of L/6) at which the link is declared
		// dead; 0: never within 4L.
		deadBy int
	}{
		{"silent", func(*linkWatch, int) {}, 8},
		{"a frame every L/2", func(live *linkWatch, tick int) {
			if tick%3 == 0 {
				live.received()
			}
		}, 0},
		{"a write stalled from the start", func(live *linkWatch, tick int) {
			if tick == 0 {
				live.writing()
			}
			if tick%3 == 0 {
				live.received()
			}
		}, 8},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cl := bubbledClient(L)
				live := newLinkWatch(cl.opts.Clock)
				ctx, cancel := context.WithCancelCause(context.Background())
				var wg sync.WaitGroup
				defer wg.Wait()
				defer cancel(nil) // before wg.Wait: ends the watchdog
				c.step(live, 0)
				wg.Go(func() { cl.watch(ctx, cancel, live) })
				for tick := 1; tick <= 24; tick++ {
					time.Sleep(L / 6)
					synctest.Wait() // the watchdog judged this instant's tick, if it had one
					dead := context.Cause(ctx) != nil
					if c.deadBy == 0 || tick < c.deadBy {
						require.False(t, dead, "at %v: declared dead", time.Duration(tick)*L/6)
						c.step(live, tick)
						continue
					}
					require.ErrorIs(t, context.Cause(ctx), errDeadLink, "at %v", time.Duration(tick)*L/6)
					if c.name == "silent" {
						require.Greater(t, time.Duration(tick)*L/6, L, "never before the timeout")
					}
					return
				}
			})
		})
	}
}

// pingRecorder is a grpc.ClientStream that records the credit frames sent
// on it, with the bubble's time of each.
type pingRecorder struct {
	grpc.ClientStream
	mu    sync.Mutex
	start time.Time
	sent  []time.Duration
}

func (p *pingRecorder) SendMsg(m any) error {
	n, _, err := decodeCredit(m.(*frame).b)
	if err != nil || n != 0 {
		panic("not a ping")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sent = append(p.sent, time.Since(p.start))
	return nil
}

func (p *pingRecorder) times() []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]time.Duration(nil), p.sent...)
}

// An idle collector pings the service every L/3, so that the service's
// watchdog (the same bound, the other way) never finds a live link
// silent; an interval in which a frame went out sends no ping.
func TestAnIdleClientPingsEveryThirdOfTheLivenessTimeout(t *testing.T) {
	const L = DefaultLivenessTimeout
	synctest.Test(t, func(t *testing.T) {
		cl := bubbledClient(L)
		live := newLinkWatch(cl.opts.Clock)
		st := &pingRecorder{start: time.Now()}
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() { cl.grant(ctx, st, 0, make(chan struct{}), live, &readMark{}) })

		time.Sleep(L)
		synctest.Wait()
		require.Equal(t, []time.Duration{L / 3, 2 * L / 3, L}, st.times(), "idle: a ping every L/3")

		time.Sleep(L / 6)
		live.writing() // a frame goes out between two ticks
		live.written()
		time.Sleep(L / 6)
		synctest.Wait()
		require.Len(t, st.times(), 3, "no ping after an interval that sent a frame")
		time.Sleep(L / 3)
		synctest.Wait()
		require.Equal(t, 5*L/3, st.times()[3], "idle again: the next tick pings")

		cancel()
		wg.Wait()
	})
}

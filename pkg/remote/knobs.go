package remote

import (
	"time"

	"github.com/cdcflow/eventservice/pkg/clock"
)

// testingKnobs are a Server's or a Client's test hooks, all in one place:
// tests set them between NewServer (NewClient) and Start; in production
// they are zero and each costs one comparison.
type testingKnobs struct {
	// watchdog, if set, is given the ticker of each data stream's
	// liveness watchdog as it is made (period: a third of the liveness
	// timeout), and the watchdog uses the ticker it returns: a test wraps
	// it to see when the watchdog has judged a tick.
	watchdog func(t clock.Ticker, period time.Duration) clock.Ticker
	// granted, if set, is called after the server applied a credit frame.
	granted func()
}

// watchdogTicker makes the ticker of a liveness watchdog on clk.
func (k *testingKnobs) watchdogTicker(clk clock.Clock, period time.Duration) clock.Ticker {
	t := clk.NewTicker(period)
	if k.watchdog != nil {
		t = k.watchdog(t, period)
	}
	return t
}

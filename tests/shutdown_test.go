package tests

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/eventservice"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// TestShutdownUnderLoad closes the whole stack while it is at its worst:
// 10k dispatchers, the transport refusing every send (congested), every
// dispatcher backing off, and the upstream still pushing rows into the
// store. Close runs collector, service, store (ending the upstream feeds
// while pushes are in flight), upstream, transport, in a goroutine: it
// must return (a hang is the failure; the deadline is generous), and
// goleak must find no goroutine left.
func TestShutdownUnderLoad(t *testing.T) {
	const dispatchers = 10000 // the count, at every scale
	s := &scenario{name: "shutdown under load", dispatchers: dispatchers}
	report(t, s)
	var tr *switchTransportForTest
	h := newHarness(t, harnessConfig{
		seed:      scenarioSeed(t, 13),
		tables:    dispatchers,
		rate:      20000,
		duration:  10 * time.Minute, // never reached: the test closes mid-run
		onDisk:    true,
		transport: func(inner messaging.Transport) messaging.Transport { tr = newSwitchTransportForTest(inner); return tr },
		svcOpts: func(o *eventservice.Options) {
			// Production back-off: 10k dispatchers retrying a refused
			// transport every few milliseconds would starve the upstream.
			o.BackoffBase, o.BackoffMax = eventservice.DefaultBackoffBase, eventservice.DefaultBackoffMax
		},
	})
	for i := range dispatchers {
		require.NoError(t, h.add(id(1, uint64(i+1)), int64(i+1), h.start))
	}
	h.run()
	// Rows are applied before the checkpoint that covers them, which wakes the wait.
	h.chk.waitFor(t, time.Minute, "data flowing to the collector", func() bool { return h.chk.stats().RowsApplied > 1000 })

	// Congestion: every send refused.
	tr.setOutage(messaging.ErrBusy)
	testwait.Within(t, time.Minute, "dispatchers backing off", func() bool {
		refused, _ := tr.counts()
		return refused > dispatchers && h.svc.Stats().BackingOff > 0
	})
	// Close with writes in flight: the upstream is still pushing.
	pushed := h.gen.Stats().Batches
	testwait.Within(t, time.Minute, "the upstream pushing into the store", func() bool { return h.gen.Stats().Batches > pushed })
	type closed struct {
		took time.Duration
		errs []error
	}
	done := make(chan closed, 1)
	go func() {
		var c closed
		start := time.Now()
		h.closeOnce.Do(func() {
			close(h.stopSchema)
			h.wg.Wait()
			h.samp.stop()
			c.errs = append(c.errs, h.coll.Close(), h.svc.Close(), h.store.Close())
			h.gen.Close()
			h.inproc.Close()
		})
		c.took = time.Since(start)
		done <- c
	}()
	select {
	case c := <-done:
		t.Logf("Close returned in %v with %d dispatchers registered, %d upstream batches pushed", c.took, dispatchers, h.gen.Stats().Batches)
		for _, err := range c.errs {
			require.NoError(t, err)
		}
	case <-time.After(scaled(t, 2*time.Minute)):
		t.Fatal("Close did not return: shutdown hangs under load")
	}
	h.requireClean()
	h.requireBounded()
	refused, _ := tr.counts()
	s.rows = int64(h.chk.stats().RowsApplied)
	s.faults = fmtFaults("transport refusing all sends: %d refused", refused)
	goleak.VerifyNone(t)
}

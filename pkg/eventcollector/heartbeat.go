package eventcollector

import (
	"errors"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventservice"
)

// heartbeat is one checkpoint to report.
type heartbeat struct {
	d          *dispatcher
	epoch      uint64
	checkpoint common.Ts
}

// runHeartbeats is the heartbeat goroutine. It is separate from the
// receive goroutine so that a blocked sink does not stop checkpoints
// already confirmed from reaching the service, nor reset retries.
func (c *Collector) runHeartbeats(t clock.Ticker) {
	defer t.Stop()
	for {
		select {
		case <-c.closing:
			return
		case <-t.C():
		}
		c.tick()
		if h := c.hooks.afterTick; h != nil {
			h()
		}
	}
}

// tick retries the resets the service has not acknowledged, then reports
// every checkpoint that advanced since the service last accepted one.
func (c *Collector) tick() {
	var resets []*dispatcher
	hbs := c.hbBuf[:0]
	c.mu.Lock()
	for _, d := range c.mu.dispatchers {
		switch {
		case d.st.needReset:
			// The service is at an older epoch: a heartbeat would be
			// refused, and the reset must be retried.
			if !d.resetting {
				resets = append(resets, d)
			}
		case d.st.checkpoint > d.lastHeartbeat:
			hbs = append(hbs, heartbeat{d: d, epoch: d.st.epoch, checkpoint: d.st.checkpoint})
		}
	}
	c.mu.Unlock()

	for _, d := range resets {
		if c.isClosing() {
			break
		}
		c.resetService(d)
	}
	for i := range hbs {
		hb := &hbs[i]
		if c.isClosing() {
			break
		}
		err := c.opts.Service.Heartbeat(hb.d.id, hb.epoch, hb.checkpoint)
		switch {
		case err == nil:
			c.cnt.serviceCalls[callHeartbeat][resultOK].Add(1)
			c.mu.Lock()
			// The service keeps a dispatcher's checkpoint across epochs,
			// so it counts even if a reset happened meanwhile.
			hb.d.lastHeartbeat = max(hb.d.lastHeartbeat, hb.checkpoint)
			c.mu.Unlock()
		case errors.Is(err, eventservice.ErrStaleEpoch):
			// A reset is in flight; the next tick reports to the new epoch.
			c.cnt.serviceCalls[callHeartbeat][resultStale].Add(1)
		default:
			c.cnt.serviceCalls[callHeartbeat][resultError].Add(1)
			c.log.Warn("heartbeat failed; retrying at the next tick", zap.Stringer("dispatcher", hb.d.id), zap.Error(err))
		}
	}
	clear(hbs) // drop the dispatcher pointers
	c.hbBuf = hbs[:0]
}

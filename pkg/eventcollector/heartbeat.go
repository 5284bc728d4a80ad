package eventcollector

import (
	"context"
	"fmt"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/touchahead"
	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

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
		if h := c.knobs.afterTick; h != nil {
			h()
		}
	}
}

// tick retries the resets the service has not acknowledged, then reports
// every checkpoint that advanced since the service last accepted one, in
// batched heartbeats of at most messaging.MaxHeartbeatCheckpoints. It looks
// only at the dispatchers listed due (a checkpoint advanced, a reset or a
// report to retry), never at every dispatcher.
func (c *Collector) tick() {
	var resets []*dispatcher
	cps := c.hbBuf.cps[:0]
	ds := c.hbBuf.ds[:0]
	c.mu.Lock()
	due := c.mu.due
	c.mu.due = c.hbBuf.spare[:0]
	for i, d := range due {
		if i%touchahead.Chunk == 0 {
			c.touchDueLocked(due[i:min(i+touchahead.Chunk, len(due))])
		}
		d.due = false
		if d.removed {
			continue
		}
		switch {
		case d.st.needReset:
			// The service is at an older epoch: a heartbeat would be
			// refused, and the reset must be retried.
			if !d.resetting {
				resets = append(resets, d)
			}
		case d.st.checkpoint > d.lastHeartbeat:
			cps = append(cps, messaging.DispatcherCheckpoint{Dispatcher: d.id, Registration: d.reg, Epoch: d.st.epoch, Ts: d.st.checkpoint,
				Slot: d.serviceSlot})
			ds = append(ds, d)
		}
	}
	clear(due)
	c.hbBuf.spare = due[:0]
	c.mu.Unlock()

	for _, d := range resets {
		if c.isClosing() {
			break
		}
		c.resetService(d)
	}
	for i := 0; i < len(cps) && !c.isClosing(); i += messaging.MaxHeartbeatCheckpoints {
		end := min(i+messaging.MaxHeartbeatCheckpoints, len(cps))
		c.heartbeat(cps[i:end], ds[i:end])
	}
	clear(ds) // drop the dispatcher pointers
	c.hbBuf.cps, c.hbBuf.ds = cps[:0], ds[:0]
}

// touchDueLocked reads the lines tick reads of a chunk of due
// dispatchers (where it starts and its checkpoint) before tick works on
// them, so that their cache misses overlap (internal/touchahead). It
// changes nothing but a sum the heartbeat goroutine owns.
// REQUIRES: c.mu held.
func (c *Collector) touchDueLocked(due []*dispatcher) {
	var t uint64
	for _, d := range due {
		t += d.id.Lo + uint64(d.lastHeartbeat)
	}
	c.hbBuf.touched = t
}

// heartbeat sends one batch of checkpoints (cps[i] of ds[i]) and records
// what the service accepted.
func (c *Collector) heartbeat(cps []messaging.DispatcherCheckpoint, ds []*dispatcher) {
	ctx, cancel := context.WithTimeout(c.ctx, c.opts.RequestTimeout)
	reply, err := c.opts.Service.Heartbeat(ctx, messaging.HeartbeatRequest{Checkpoints: cps})
	cancel()
	if err == nil && len(reply.Codes) != len(cps) {
		err = errBadHeartbeatReply(len(reply.Codes), len(cps))
	}
	if err != nil {
		c.cnt.serviceCalls[callHeartbeat][resultError].Add(uint64(len(cps)))
		c.log.Warn("heartbeat failed; retrying at the next tick", zap.Int("checkpoints", len(cps)), zap.Error(err))
		c.mu.Lock()
		for _, d := range ds {
			c.dueLocked(d)
		}
		c.mu.Unlock()
		return
	}
	failed, firstBad := 0, -1
	c.mu.Lock()
	for i, code := range reply.Codes {
		switch code {
		case messaging.CodeOK:
			c.cnt.serviceCalls[callHeartbeat][resultOK].Add(1)
			// The service keeps a dispatcher's checkpoint across epochs,
			// so it counts even if a reset happened meanwhile.
			ds[i].lastHeartbeat = max(ds[i].lastHeartbeat, cps[i].Ts)
		case messaging.CodeStaleEpoch:
			// A reset is in flight; the next tick reports to the new epoch.
			c.cnt.serviceCalls[callHeartbeat][resultStale].Add(1)
			c.dueLocked(ds[i])
		default:
			c.cnt.serviceCalls[callHeartbeat][resultError].Add(1)
			c.dueLocked(ds[i])
			if failed++; firstBad < 0 {
				firstBad = i
			}
		}
	}
	c.mu.Unlock()
	if failed > 0 {
		c.log.Warn("heartbeat entries refused; retrying at the next tick", zap.Int("refused", failed),
			zap.Stringer("first", cps[firstBad].Dispatcher), zap.Stringer("code", reply.Codes[firstBad]))
	}
}

// errBadHeartbeatReply: a reply whose codes do not match the request.
func errBadHeartbeatReply(got, want int) error {
	return fmt.Errorf("%w: heartbeat reply has %d codes for %d checkpoints", messaging.ErrInternal, got, want)
}

package eventcollector

import (
	"context"
	"errors"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// runReceive is the receive goroutine: it drains at most MaxDrain messages
// at a time and handles them in order, checking for Close between
// messages. Holding no more than one drained batch is what bounds the
// collector's memory: while the sink is slow the rest waits in the bounded
// inbox, and the service's sends are refused.
func (c *Collector) runReceive() {
	in := c.opts.Inbox
	batch := make([]messaging.Message, 0, c.opts.MaxDrain)
	done := in.Done()
	for {
		select {
		case <-c.closing:
			return
		case <-in.Ready():
		case <-done:
			// Closed or unregistered: what was accepted before is still
			// drained below (a partial Drain re-rings Ready for the rest).
			done = nil
		}
		batch = in.Drain(batch[:0], c.opts.MaxDrain)
		for _, m := range batch {
			if c.isClosing() {
				break
			}
			c.handle(m)
			if h := c.knobs.afterHandle; h != nil {
				h(m)
			}
		}
		clear(batch) // do not keep applied messages alive
	}
}

// handle checks one message against its dispatcher's stream and acts on
// the verdict.
func (c *Collector) handle(m messaging.Message) {
	if isNilMessage(m) {
		c.cnt.ignored[ignoreUnknownDispatcher].Add(1) // the transport refuses these; be safe
		return
	}
	if k := int(m.Kind()); k >= 1 && k <= numKinds {
		c.cnt.received[k-1].Add(1)
	}
	verr := messaging.Validate(m)
	h := m.MessageHeader()
	c.mu.Lock()
	d := c.mu.dispatchers[h.Dispatcher]
	switch {
	case d == nil:
		c.mu.Unlock()
		c.cnt.ignored[ignoreUnknownDispatcher].Add(1)
		return
	case h.Registration != d.reg:
		// An earlier registration of the ID (removed and added again):
		// its messages may still be in flight and must never touch the
		// new registration's stream.
		c.mu.Unlock()
		c.cnt.ignored[ignoreStaleRegistration].Add(1)
		return
	}
	v := d.st.receive(m, verr != nil)
	epoch := d.st.epoch
	if v.kind.callsSink() {
		c.mu.inSink = d // under the verdict's lock: see Collector.mu.inSink
	}
	c.mu.Unlock()

	switch v.kind {
	case verdictNone:
	case verdictStale:
		if h.Epoch < epoch {
			c.cnt.ignored[ignoreStaleEpoch].Add(1)
		} else {
			c.cnt.ignored[ignoreStaleResolved].Add(1)
		}
	case verdictReset:
		c.afterReset(d, v.reason, epoch, verr, m)
	default:
		c.apply(d, epoch, v)
	}
}

// apply makes the sink call of v, outside the lock, and records its
// outcome: a confirmed checkpoint, or a reset on error.
func (c *Collector) apply(d *dispatcher, epoch uint64, v verdict) {
	sink := c.opts.Sink
	sw := clock.StartStopwatch()
	var err error
	op := opBegin
	switch v.kind {
	case verdictBegin:
		err = sink.BeginEpoch(d.id, epoch, v.ts)
	case verdictRows:
		op = opRows
		if err = sink.ApplyRows(d.id, v.rows); err == nil {
			c.cnt.rowsApplied.Add(uint64(len(v.rows)))
		}
	case verdictDDL:
		op = opDDL
		err = sink.ApplyDDL(d.id, v.ddl)
	case verdictCheckpoint:
		op = opCheckpoint
		err = sink.Checkpoint(d.id, v.ts)
	}
	c.metrics.observeSink(op, sw.Elapsed())

	c.mu.Lock()
	c.mu.inSink = nil
	if c.mu.sinkDone != nil {
		close(c.mu.sinkDone) // a RemoveDispatcher waits for this call
		c.mu.sinkDone = nil
	}
	if d.removed || d.st.epoch != epoch {
		// Removed meanwhile; nothing else changes the epoch while the
		// receive goroutine is in the sink.
		c.mu.Unlock()
		return
	}
	if err != nil {
		d.st.reset(ResetSinkError, 0)
		newEpoch := d.st.epoch
		c.mu.Unlock()
		c.afterReset(d, ResetSinkError, newEpoch, err, nil)
		return
	}
	if v.kind == verdictCheckpoint && !c.async {
		d.st.checkpointed(v.ts)
	}
	if d.st.checkpoint > d.lastHeartbeat {
		// A checkpoint to report: a new one, or one a reset kept back
		// until this epoch's handshake acknowledged the reset.
		c.dueLocked(d)
	}
	c.mu.Unlock()
}

// durable records a checkpoint an AsyncSink made durable: it counts for
// heartbeats and resets from now on, if the dispatcher is still in that
// epoch (a later epoch reports its own).
func (c *Collector) durable(id common.DispatcherID, epoch uint64, ts common.Ts) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d := c.mu.dispatchers[id]
	if d == nil || d.removed || d.st.epoch != epoch || ts <= d.st.checkpoint {
		return
	}
	d.st.checkpointed(ts)
	if d.st.checkpoint > d.lastHeartbeat {
		c.dueLocked(d)
	}
}

// afterReset counts and logs a reset the stream already made (its epoch is
// now newEpoch) and asks the service for it.
func (c *Collector) afterReset(d *dispatcher, reason ResetReason, newEpoch uint64, cause error, m messaging.Message) {
	c.cnt.resets[reason].Add(1)
	fields := []zap.Field{zap.Stringer("dispatcher", d.id), zap.Stringer("reason", reason), zap.Uint64("epoch", newEpoch)}
	if m != nil {
		h := m.MessageHeader()
		fields = append(fields, zap.Stringer("kind", m.Kind()), zap.Uint64("msgEpoch", h.Epoch), zap.Uint64("msgSeq", h.Seq))
	}
	if cause != nil {
		fields = append(fields, zap.Error(cause))
	}
	c.log.Info("resetting dispatcher", fields...)
	c.resetService(d)
}

// resetService asks the service to start the dispatcher's current local
// epoch from its checkpoint, until the service acknowledged it or failed.
// One call per dispatcher is in flight at a time (d.resetting); a failure
// leaves needReset set and the next heartbeat tick retries, so a recovery
// is never lost.
func (c *Collector) resetService(d *dispatcher) {
	staleRetried := false
	for {
		c.mu.Lock()
		if d.removed || !d.st.needReset || d.resetting {
			c.mu.Unlock()
			return
		}
		d.resetting = true
		epoch, startTs := d.st.epoch, d.st.startTs
		c.mu.Unlock()

		ctx, cancel := context.WithTimeout(c.ctx, c.opts.RequestTimeout)
		err := c.opts.Service.Reset(ctx, messaging.ResetRequest{Dispatcher: d.id, Registration: d.reg, Epoch: epoch, StartTs: startTs})
		cancel()

		c.mu.Lock()
		d.resetting = false
		switch {
		case err == nil:
			c.cnt.serviceCalls[callReset][resultOK].Add(1)
			if d.st.epoch == epoch {
				d.st.needReset = false
				if d.st.checkpoint > d.lastHeartbeat {
					c.dueLocked(d) // the checkpoint it could not report meanwhile
				}
			}
			// Otherwise a message of a newer service epoch moved ours
			// meanwhile: loop to reset to it (needReset is still set).
			c.mu.Unlock()
		case errors.Is(err, messaging.ErrStaleEpoch):
			c.cnt.serviceCalls[callReset][resultStale].Add(1)
			if !d.st.needReset {
				c.mu.Unlock() // a handshake of ours arrived meanwhile
				return
			}
			giveUp := false
			if d.st.epoch == epoch {
				// The service is at this epoch or a newer one (a
				// concurrent reset won): go above it, retrying once here
				// and then once per heartbeat tick.
				d.st.bumpEpoch()
				giveUp, staleRetried = staleRetried, true
			}
			if giveUp {
				c.dueLocked(d) // the next tick retries
			}
			c.mu.Unlock()
			if giveUp {
				return
			}
		default:
			c.cnt.serviceCalls[callReset][resultError].Add(1)
			c.dueLocked(d) // the next tick retries
			c.mu.Unlock()
			c.log.Warn("reset failed; retrying at the next heartbeat", zap.Stringer("dispatcher", d.id),
				zap.Uint64("epoch", epoch), zap.Error(err))
			return
		}
	}
}

// isNilMessage reports a nil interface or a typed nil pointer.
func isNilMessage(m messaging.Message) bool {
	switch v := m.(type) {
	case *messaging.Handshake:
		return v == nil
	case *messaging.DMLBatch:
		return v == nil
	case *messaging.DDL:
		return v == nil
	case *messaging.Resolved:
		return v == nil
	default:
		return m == nil
	}
}

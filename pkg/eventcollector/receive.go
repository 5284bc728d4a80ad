package eventcollector

import (
	"context"
	"errors"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/touchahead"
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
			if b, ok := m.(*messaging.ResolvedBatch); ok {
				// Applied: nothing here reads its entries again, and the
				// sender may reuse their memory (messaging.Releaser).
				b.Release()
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
	if b, ok := m.(*messaging.ResolvedBatch); ok {
		c.handleBatch(b)
		return
	}
	verr := messaging.Validate(m)
	h := m.MessageHeader()
	c.mu.Lock()
	var d *dispatcher
	if r, ok := m.(*messaging.Resolved); ok {
		d = c.lookupLocked(r)
	} else {
		d, _ = c.mu.dispatchers.Lookup(h.Dispatcher)
	}
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
	if v.kind == verdictBegin {
		d.serviceSlot = m.(*messaging.Handshake).Slot
	}
	if v.kind.callsSink() {
		d.inSink = true // under the verdict's lock: see dispatcher.inSink
	}
	c.mu.Unlock()

	switch v.kind {
	case verdictNone:
	case verdictStale:
		c.countStale(h.Epoch, epoch)
	case verdictReset:
		c.afterReset(d, v.reason, epoch, verr, m)
	default:
		sw := clock.StartStopwatch()
		err := c.call(d, epoch, v)
		c.metrics.observeSink(v.kind.op(), sw.Elapsed())
		c.mu.Lock()
		c.sinkCallsEndedLocked()
		d.inSink = false
		reset, newEpoch := c.recordLocked(d, epoch, v, err)
		c.mu.Unlock()
		if reset {
			c.afterReset(d, ResetSinkError, newEpoch, err, nil)
		}
	}
}

// countStale counts a stale verdict: of an older epoch, or a resolved-ts
// overtaken by later messages.
func (c *Collector) countStale(msgEpoch, epoch uint64) {
	if msgEpoch < epoch {
		c.cnt.ignored[ignoreStaleEpoch].Add(1)
	} else {
		c.cnt.ignored[ignoreStaleResolved].Add(1)
	}
}

// batchCall is one sink call a resolved-ts batch asks for.
type batchCall struct {
	d     *dispatcher
	epoch uint64
	v     verdict
	err   error
}

// batchReset is one reset a resolved-ts batch's entry caused.
type batchReset struct {
	d      *dispatcher
	reason ResetReason
	epoch  uint64
	cause  error
	m      messaging.Message
}

// sampleSinkEvery: one sink call in this many of resolved-ts batches is
// timed for the sink-latency metric (sink_duration_seconds{op="checkpoint"}).
const sampleSinkEvery = 8

// handleBatch applies a resolved-ts batch: each entry as a Resolved alone
// would be, in order, with one lock for all the verdicts and one for all
// the outcomes instead of two per entry, each dispatcher found by its
// slot, and one sink call in sampleSinkEvery timed.
func (c *Collector) handleBatch(b *messaging.ResolvedBatch) {
	if err := messaging.Validate(b); err != nil {
		c.cnt.ignored[ignoreInvalidBatch].Add(1)
		c.log.Warn("ignoring an invalid resolved-ts batch", zap.Error(err))
		return
	}
	c.cnt.received[messaging.KindResolved-1].Add(uint64(len(b.Entries)))
	calls, resets := c.batchBuf.list[:0], c.batchBuf.resets[:0]
	c.mu.Lock()
	for i := range b.Entries {
		if i%touchahead.Chunk == 0 {
			c.touchLocked(b.Entries[i:min(i+touchahead.Chunk, len(b.Entries))])
		}
		e := &b.Entries[i]
		verr := messaging.ValidateEntry(e)
		d := c.lookupLocked(e)
		switch {
		case d == nil:
			c.cnt.ignored[ignoreUnknownDispatcher].Add(1)
			continue
		case e.Registration != d.reg:
			c.cnt.ignored[ignoreStaleRegistration].Add(1)
			continue
		}
		v := d.st.receive(e, verr != nil)
		switch v.kind {
		case verdictNone:
		case verdictStale:
			c.countStale(e.Epoch, d.st.epoch)
		case verdictReset:
			resets = append(resets, batchReset{d: d, reason: v.reason, epoch: d.st.epoch, cause: verr, m: e})
		default:
			d.inSink = true // under the verdict's lock: see dispatcher.inSink
			calls = append(calls, batchCall{d: d, epoch: d.st.epoch, v: v})
		}
	}
	c.mu.Unlock()

	if cb, ok := c.opts.Sink.(CheckpointBatcher); ok && len(calls) > 1 && c.distinct(calls) {
		c.checkpointBatch(cb, calls)
	} else if len(calls) > 0 {
		for i := range calls {
			k := &calls[i]
			// One checkpoint call in sampleSinkEvery is timed: a clock
			// read and a histogram update cost about what the call does.
			if c.batchBuf.calls++; c.batchBuf.calls%sampleSinkEvery != 1 {
				k.err = c.call(k.d, k.epoch, k.v)
				continue
			}
			sw := clock.StartStopwatch()
			k.err = c.call(k.d, k.epoch, k.v)
			c.metrics.observeSink(k.v.kind.op(), sw.Elapsed())
		}
	}
	if len(calls) > 0 {
		c.mu.Lock()
		c.sinkCallsEndedLocked()
		for i := range calls {
			k := &calls[i]
			k.d.inSink = false
			if reset, newEpoch := c.recordLocked(k.d, k.epoch, k.v, k.err); reset {
				resets = append(resets, batchReset{d: k.d, reason: ResetSinkError, epoch: newEpoch, cause: k.err})
			}
		}
		c.mu.Unlock()
	}
	for _, r := range resets {
		if c.isClosing() {
			break
		}
		c.afterReset(r.d, r.reason, r.epoch, r.cause, r.m)
	}
	clear(calls) // drop the dispatcher pointers
	clear(resets)
	c.batchBuf.list, c.batchBuf.resets = calls[:0], resets[:0]
}

// touchLocked reads the words of the entries' dispatchers that applying
// them reads first (found by slot, as lookupLocked does), so that their
// cache misses overlap (internal/touchahead). It changes nothing but
// batchBuf.touched, which keeps the loads from being compiled away.
// REQUIRES: c.mu held; the receive goroutine.
func (c *Collector) touchLocked(entries []messaging.Resolved) {
	var t uint64
	for i := range entries {
		if d, ok := c.mu.dispatchers.At(entries[i].Slot); ok {
			t += d.id.Lo + d.batchMark // its first line and its last
		}
	}
	c.batchBuf.touched = t
}

// distinct reports whether calls name each dispatcher once (a batch from
// our service always does; a lying one may repeat an entry, and then the
// calls go one by one, in order, as for a sink without batches). Each
// dispatcher is marked with the batch's number, so the check costs no map
// insert per entry.
func (c *Collector) distinct(calls []batchCall) bool {
	c.batchBuf.mark++
	mark := c.batchBuf.mark
	for i := range calls {
		d := calls[i].d
		if d.batchMark == mark {
			return false
		}
		d.batchMark = mark
	}
	return true
}

// checkpointBatch makes a batch's checkpoint calls (every call of a
// resolved-ts batch is one) as one CheckpointBatch, timed as one call.
func (c *Collector) checkpointBatch(cb CheckpointBatcher, calls []batchCall) {
	cps, errs := c.batchBuf.cps[:0], c.batchBuf.errs[:0]
	for i := range calls {
		cps = append(cps, SinkCheckpoint{ID: calls[i].d.id, Ts: calls[i].v.ts, Slot: calls[i].d.slot})
		errs = append(errs, nil)
	}
	sw := clock.StartStopwatch()
	cb.CheckpointBatch(cps, errs)
	c.metrics.observeSink(opCheckpoint, sw.Elapsed())
	for i := range calls {
		calls[i].err = errs[i]
	}
	clear(errs)
	c.batchBuf.cps, c.batchBuf.errs = cps[:0], errs[:0]
}

// call makes the sink call of verdict v for d.
func (c *Collector) call(d *dispatcher, epoch uint64, v verdict) error {
	sink := c.opts.Sink
	switch v.kind {
	case verdictBegin:
		return sink.BeginEpoch(d.id, epoch, v.ts)
	case verdictRows:
		err := sink.ApplyRows(d.id, v.rows)
		if err == nil {
			c.cnt.rowsApplied.Add(uint64(len(v.rows)))
		}
		return err
	case verdictDDL:
		return sink.ApplyDDL(d.id, v.ddl)
	case verdictCheckpoint:
		return sink.Checkpoint(d.id, v.ts)
	}
	return nil
}

// sinkCallsEndedLocked wakes a RemoveDispatcher waiting for the sink calls
// that just ended. REQUIRES: c.mu held.
func (c *Collector) sinkCallsEndedLocked() {
	if c.mu.sinkDone != nil {
		close(c.mu.sinkDone)
		c.mu.sinkDone = nil
	}
}

// recordLocked records the outcome of d's sink call for v in epoch: a
// confirmed checkpoint, or (reset true) a reset to newEpoch on error,
// which the caller then asks the service for (afterReset) outside the
// lock. REQUIRES: c.mu held.
func (c *Collector) recordLocked(d *dispatcher, epoch uint64, v verdict, err error) (reset bool, newEpoch uint64) {
	if d.removed || d.st.epoch != epoch {
		// Removed meanwhile; nothing else changes the epoch while the
		// receive goroutine is in the sink.
		return false, 0
	}
	if err != nil {
		d.st.reset(ResetSinkError, 0)
		return true, d.st.epoch
	}
	if v.kind == verdictCheckpoint && !c.async {
		d.st.checkpointed(v.ts)
	}
	if d.st.checkpoint > d.lastHeartbeat {
		// A checkpoint to report: a new one, or one a reset kept back
		// until this epoch's handshake acknowledged the reset.
		c.dueLocked(d)
	}
	return false, 0
}

// durable records a checkpoint an AsyncSink made durable: it counts for
// heartbeats and resets from now on, if the dispatcher is still in that
// epoch (a later epoch reports its own).
func (c *Collector) durable(id common.DispatcherID, epoch uint64, ts common.Ts) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, _ := c.mu.dispatchers.Lookup(id)
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

package eventservice

import (
	"context"
	"fmt"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/touchahead"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// Heartbeat records many dispatchers' checkpoints. Each entry is judged on
// its own (HeartbeatReply.Codes): a checkpoint only moves forward, is
// capped at what was sent, and drives the store's GC; an entry of another
// epoch is refused with CodeStaleEpoch, one of another registration with
// CodeStaleRegistration, one of a target the caller may not act for with
// CodePermissionDenied. The call itself fails only for a bad request or a
// closed service.
func (svc *Service) Heartbeat(ctx context.Context, req messaging.HeartbeatRequest) (messaging.HeartbeatReply, error) {
	if err := req.Validate(); err != nil {
		return messaging.HeartbeatReply{}, err
	}
	if err := callerGone(ctx, "heartbeat"); err != nil {
		return messaging.HeartbeatReply{}, err
	}
	buf := svc.heartbeatBuf(len(req.Checkpoints))
	defer svc.putHeartbeatBuf(buf)
	ds := *buf
	svc.mu.RLock()
	if svc.mu.closed {
		svc.mu.RUnlock()
		return messaging.HeartbeatReply{}, closedError("heartbeat")
	}
	for i := range req.Checkpoints {
		if i%touchahead.Chunk == 0 {
			svc.touchSlotsLocked(req.Checkpoints[i:min(i+touchahead.Chunk, len(req.Checkpoints))])
		}
		ds[i] = svc.lookupCheckpointLocked(&req.Checkpoints[i])
	}
	svc.mu.RUnlock()
	reply := messaging.HeartbeatReply{Codes: make([]messaging.Code, len(req.Checkpoints))}
	auth := messaging.AuthorityOf(ctx)
	for i := range req.Checkpoints {
		if i%touchahead.Chunk == 0 {
			touchForCheckpoint(ds[i:min(i+touchahead.Chunk, len(ds))])
		}
		cp := &req.Checkpoints[i]
		if ds[i] != nil && !messaging.MayServe(auth, ds[i].target.name) {
			reply.Codes[i] = messaging.CodeOf(svc.denied(auth, ds[i].target.name, "heartbeat"))
			continue
		}
		err := svc.checkpoint(ds[i], cp)
		reply.Codes[i] = messaging.CodeOf(err)
		if reply.Codes[i] == messaging.CodeInternal {
			svc.log.Warn("heartbeat: checkpoint not recorded", zap.Stringer("dispatcher", cp.Dispatcher), zap.Error(err))
		}
	}
	return reply, nil
}

// heartbeatBuf returns a slice of n dispatchers for one Heartbeat call,
// from the pool when one there is long enough: allocated per call, a
// million dispatchers' heartbeats brought the GC's long cycles forward
// (docs/benchmarks.md, "Garbage").
func (svc *Service) heartbeatBuf(n int) *[]*dispatcher {
	if p, ok := svc.heartbeatBufs.Get().(*[]*dispatcher); ok && cap(*p) >= n {
		*p = (*p)[:n]
		return p
	}
	ds := make([]*dispatcher, n)
	return &ds
}

// putHeartbeatBuf pools p, emptied so that it keeps no dispatcher alive.
func (svc *Service) putHeartbeatBuf(p *[]*dispatcher) {
	clear(*p)
	*p = (*p)[:0]
	svc.heartbeatBufs.Put(p)
}

// touchSlotsLocked reads the first word lookupCheckpointLocked compares
// of the dispatchers a chunk of heartbeat entries name by slot, before the
// lookups, so that their cache misses overlap (internal/touchahead). It
// changes nothing.
// REQUIRES: svc.mu held (read).
func (svc *Service) touchSlotsLocked(cps []messaging.DispatcherCheckpoint) {
	var t uint64
	for i := range cps {
		if d, ok := svc.mu.dispatchers.At(cps[i].Slot); ok {
			t += d.id.Lo
		}
	}
	touchahead.Keep(t)
}

// touchForCheckpoint reads a word of each line checkpoint reads of a chunk
// of dispatchers (nil: none) before it runs on them: the frontier's line,
// the session's epoch and sent, the registration, the lock. It changes
// nothing.
func touchForCheckpoint(ds []*dispatcher) {
	var t uint64
	for _, d := range ds {
		if d == nil {
			continue
		}
		d.maxCommit.Load()
		if s := d.session.Load(); s != nil {
			t += s.epoch
			s.sent.Load()
		}
		t += uint64(d.reg)
		touchahead.Lock(&d.mu.Mutex)
	}
	touchahead.Keep(t)
}

// lookupCheckpointLocked finds the dispatcher a heartbeat entry names: by
// the slot its handshake gave the collector when that slot holds the ID
// (a collector may echo any slot: it is a hint, and the entry's
// registration and authority are checked after), by ID otherwise.
// REQUIRES: svc.mu held (read).
func (svc *Service) lookupCheckpointLocked(cp *messaging.DispatcherCheckpoint) *dispatcher {
	if d, ok := svc.mu.dispatchers.At(cp.Slot); ok && d.id == cp.Dispatcher {
		return d
	}
	d, _ := svc.mu.dispatchers.Lookup(cp.Dispatcher)
	return d
}

// checkpoint records one heartbeat entry for d (nil: not registered). The
// checkpoint always moves (keepalives read it as the acknowledgement); the
// store is told only when storeNeedsCheckpoint says it may matter.
func (svc *Service) checkpoint(d *dispatcher, cp *messaging.DispatcherCheckpoint) error {
	switch {
	case cp.Dispatcher.IsZero() || cp.Registration.IsZero():
		return fmt.Errorf("%w: zero dispatcher or registration", messaging.ErrInvalidRequest)
	case d == nil:
		return fmt.Errorf("%w: %v", messaging.ErrUnknownDispatcher, cp.Dispatcher)
	case d.reg != cp.Registration:
		return fmt.Errorf("%w: %v registration %v, current %v", messaging.ErrStaleRegistration, cp.Dispatcher, cp.Registration, d.reg)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.mu.removed {
		return fmt.Errorf("%w: %v", messaging.ErrUnknownDispatcher, d.id)
	}
	s := d.session.Load()
	if s.epoch != cp.Epoch {
		return fmt.Errorf("%w: checkpoint of epoch %d, current %d", messaging.ErrStaleEpoch, cp.Epoch, s.epoch)
	}
	ts := min(cp.Ts, common.Ts(s.sent.Load()))
	prev := d.mu.checkpoint
	if ts <= prev {
		return nil
	}
	d.mu.checkpoint = ts
	if !storeNeedsCheckpoint(prev, common.Ts(d.maxCommit.Load())) {
		return nil
	}
	var err error
	if d.mu.store.Valid() {
		err = d.mu.store.UpdateCheckpoint(ts)
	} else {
		err = svc.opts.Store.UpdateCheckpoint(d.id, ts)
	}
	if err != nil {
		return fmt.Errorf("%w: checkpoint %v: %w", messaging.ErrInternal, d.id, err)
	}
	return nil
}

// storeNeedsCheckpoint reports whether the store must be given a checkpoint
// that moved up from prev, given maxCommit, the largest commit-ts of any row
// the store notified for the dispatcher (dispatcher.maxCommit).
//
// The store uses a dispatcher's checkpoint only to collect the rows at or
// below it (and to refuse a scan from below it). A row the checkpoint passed
// was notified before the resolved-ts that let the checkpoint pass it
// (Notify raises maxCommit before received), so when maxCommit is at or below
// prev no row lies between prev and the new checkpoint, and the store's older
// value collects exactly what the new one would: by induction, none lies
// between the checkpoint the store holds and this one either. A quiet
// dispatcher, whose checkpoint advances with its resolved-ts alone, then
// costs the store nothing per heartbeat entry, where each update touched its
// subscription (a lock and two cold cache lines at a million dispatchers).
// The first checkpoint past a row goes to the store, whatever came before, so
// collection follows rows as before.
func storeNeedsCheckpoint(prev, maxCommit common.Ts) bool { return maxCommit > prev }

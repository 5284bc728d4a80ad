package eventservice

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/touchahead"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// The service's side of the control plane: Service implements
// messaging.ControlPlane. Errors wrap messaging's control-plane sentinels
// (so a network transport can carry them as a messaging.Code) and, where
// the service has a sentinel of its own (ErrClosed), that one too.
var _ messaging.ControlPlane = (*Service)(nil)

// Register adds a dispatcher registration and starts its first epoch: the
// handshake and progress up to the store's resolved-ts follow without
// waiting for a notification. Repeating the current registration's request
// is accepted (a retried request); any other registration of a registered
// ID is refused with messaging.ErrDispatcherExists. A Register before Start
// is accepted: its work waits in the queues until the workers start (an
// embedder may register what it recovered, then start).
func (svc *Service) Register(ctx context.Context, req messaging.RegisterRequest) error {
	if err := req.Validate(); err != nil {
		return err
	}
	if err := callerGone(ctx, "register"); err != nil {
		return err
	}
	auth := messaging.AuthorityOf(ctx)
	if !messaging.MayServe(auth, req.Target) {
		return svc.denied(auth, req.Target, "register")
	}
	d, s, err := svc.addDispatcher(req)
	if req.Replace && errors.Is(err, messaging.ErrDispatcherExists) {
		// Take over: end the registration the caller no longer knows, then
		// register. A register racing this one may win; then it is the
		// caller's ErrDispatcherExists again. Only a caller that may act
		// for the old registration's target may end it.
		if old, lerr := svc.lookupID(req.Dispatcher); lerr == nil {
			if !messaging.MayServe(auth, old.target.name) {
				return svc.denied(auth, old.target.name, "take over "+req.Dispatcher.String())
			}
			if rerr := svc.Remove(ctx, messaging.RemoveRequest{Dispatcher: req.Dispatcher, Registration: old.reg}); rerr != nil &&
				!errors.Is(rerr, messaging.ErrUnknownDispatcher) && !errors.Is(rerr, messaging.ErrStaleRegistration) {
				return rerr
			}
		}
		d, s, err = svc.addDispatcher(req)
	}
	if d == nil {
		return err
	}
	if err := svc.registerInStore(d, s, req.StartTs); err != nil {
		svc.forget(d)
		return err
	}
	svc.request(s, false)
	return nil
}

// RegisterBatch registers each entry as Register would and answers entry
// by entry. The entries that are new dispatchers are mapped under one
// acquisition of the service's lock, not one each; a take-over (Replace of
// a registered ID) goes through Register.
func (svc *Service) RegisterBatch(ctx context.Context, req messaging.RegisterBatchRequest) (messaging.RegisterBatchReply, error) {
	if err := req.Validate(); err != nil {
		return messaging.RegisterBatchReply{}, err
	}
	if err := callerGone(ctx, "register"); err != nil {
		return messaging.RegisterBatchReply{}, err
	}
	reply := messaging.RegisterBatchReply{Codes: make([]messaging.Code, len(req.Requests))}
	auth := messaging.AuthorityOf(ctx)
	added := make([]addedDispatcher, len(req.Requests))
	errs := make([]error, len(req.Requests))
	for i := range req.Requests {
		r := &req.Requests[i]
		if err := r.Validate(); err != nil {
			errs[i] = err
		} else if !messaging.MayServe(auth, r.Target) {
			errs[i] = svc.denied(auth, r.Target, "register")
		}
	}
	svc.addDispatchers(req.Requests, errs, added)
	for i := range req.Requests {
		r, a, err := &req.Requests[i], added[i], errs[i]
		switch {
		case a.d != nil:
			if err = svc.registerInStore(a.d, a.s, r.StartTs); err != nil {
				svc.forget(a.d)
			} else {
				svc.request(a.s, false)
			}
		case r.Replace && errors.Is(err, messaging.ErrDispatcherExists):
			err = svc.Register(ctx, *r)
		}
		reply.Codes[i] = messaging.CodeOf(err)
	}
	return reply, nil
}

// addedDispatcher is a dispatcher addDispatchers created (nil d: none).
type addedDispatcher struct {
	d *dispatcher
	s *session
}

// addDispatchers is addDispatcher for every reqs[i] whose errs[i] is nil,
// under one acquisition of the service's lock: added[i] or errs[i] is set
// (neither for a repeated request).
func (svc *Service) addDispatchers(reqs []messaging.RegisterRequest, errs []error, added []addedDispatcher) {
	svc.mu.Lock()
	defer svc.mu.Unlock()
	for i := range reqs {
		if errs[i] == nil {
			added[i].d, added[i].s, errs[i] = svc.addDispatcherLocked(reqs[i])
		}
	}
}

// addDispatcher creates and maps the dispatcher of req, with d.mu held (so
// a Remove or Close that finds it waits for its store registration). It
// returns a nil dispatcher with the error to return (nil for a repeated
// request).
func (svc *Service) addDispatcher(req messaging.RegisterRequest) (*dispatcher, *session, error) {
	svc.mu.Lock()
	defer svc.mu.Unlock()
	return svc.addDispatcherLocked(req)
}

// addDispatcherLocked is addDispatcher's body. REQUIRES: svc.mu held.
func (svc *Service) addDispatcherLocked(req messaging.RegisterRequest) (*dispatcher, *session, error) {
	if svc.mu.closed {
		return nil, nil, closedError("register")
	}
	if d, ok := svc.mu.dispatchers.Lookup(req.Dispatcher); ok {
		if d.reg == req.Registration && d.span.Span().Equal(req.Span) && d.target.name == req.Target && d.registeredAt() == req.StartTs {
			return nil, nil, nil // the same request again
		}
		return nil, nil, fmt.Errorf("%w: %v (registration %v, asked %v)", messaging.ErrDispatcherExists, req.Dispatcher, d.reg, req.Registration)
	}
	if err := svc.withinBoundsLocked(req.Span); err != nil {
		return nil, nil, err
	}
	t, err := svc.targetForRegisterLocked(req.Target)
	if err != nil {
		return nil, nil, err
	}
	t.dispatchers++
	svc.mu.spanKeyBytes += spanKeyBytes(req.Span)
	d := &dispatcher{id: req.Dispatcher, reg: req.Registration, span: common.Pack(req.Span), target: t,
		worker: req.Dispatcher.Index(len(svc.prepQueues)), svc: svc, collectorSlot: req.Slot}
	d.mu.storeStart = req.StartTs
	d.mu.checkpoint = req.StartTs
	s := &d.first
	s.init(d, 1, req.StartTs)
	d.session.Store(s)
	d.slot = svc.mu.dispatchers.Add(d)
	// d.mu is taken before d is visible to anyone else and held across the
	// store registration (registerInStore releases it).
	d.mu.Lock()
	return d, s, nil
}

// targetForRegisterLocked returns the target a new dispatcher of name
// joins, creating it, within MaxTargets and MaxDispatchersPerTarget.
// REQUIRES: svc.mu held.
func (svc *Service) targetForRegisterLocked(name messaging.Target) (*target, error) {
	t, ok := svc.mu.targets[name]
	switch {
	case !ok && len(svc.mu.targets) >= svc.opts.MaxTargets:
		svc.metrics.refusedControl.WithLabelValues(refusedMaxTargets).Inc()
		return nil, fmt.Errorf("%w: %d targets already, MaxTargets %d: %q refused", messaging.ErrLimitExceeded,
			len(svc.mu.targets), svc.opts.MaxTargets, name)
	case ok && t.dispatchers >= svc.opts.MaxDispatchersPerTarget:
		svc.metrics.refusedControl.WithLabelValues(refusedMaxDispatchers).Inc()
		return nil, fmt.Errorf("%w: target %q has %d dispatchers, MaxDispatchersPerTarget %d", messaging.ErrLimitExceeded,
			name, t.dispatchers, svc.opts.MaxDispatchersPerTarget)
	case ok:
		return t, nil
	}
	return svc.targetLocked(name)
}

// withinBoundsLocked refuses one more dispatcher beyond MaxDispatchers,
// or span keys beyond MaxSpanKeyBytes. REQUIRES: svc.mu held.
func (svc *Service) withinBoundsLocked(span common.Span) error {
	switch {
	case svc.mu.dispatchers.Len() >= svc.opts.MaxDispatchers:
		svc.metrics.refusedControl.WithLabelValues(refusedMaxDispatchersTotal).Inc()
		return fmt.Errorf("%w: %d dispatchers registered, MaxDispatchers %d", messaging.ErrLimitExceeded,
			svc.mu.dispatchers.Len(), svc.opts.MaxDispatchers)
	case svc.mu.spanKeyBytes+spanKeyBytes(span) > svc.opts.MaxSpanKeyBytes:
		svc.metrics.refusedControl.WithLabelValues(refusedSpanKeyBytes).Inc()
		return fmt.Errorf("%w: span keys would take %d bytes, MaxSpanKeyBytes %d", messaging.ErrLimitExceeded,
			svc.mu.spanKeyBytes+spanKeyBytes(span), svc.opts.MaxSpanKeyBytes)
	}
	return nil
}

func spanKeyBytes(s common.Span) int64 { return int64(len(s.StartKey) + len(s.EndKey)) }

// targetCount is the number of targets with registered dispatchers.
func (svc *Service) targetCount() int {
	svc.mu.RLock()
	defer svc.mu.RUnlock()
	return len(svc.mu.targets)
}

// registerInStore registers d in the store and releases d.mu (held by
// addDispatcher), by defer: a store that panics must not leave d locked
// for every later Remove and Close. On failure d is marked removed and its
// session retired; the caller forgets it.
func (svc *Service) registerInStore(d *dispatcher, s *session, startTs common.Ts) error {
	defer d.mu.Unlock()
	// Outside Service.mu: the store may call the notifier synchronously
	// (the notify path takes no lock of ours).
	err := svc.storeRegisterLocked(d, startTs)
	if err == nil {
		return nil
	}
	d.mu.removed = true
	svc.retire(s)
	if errors.Is(err, eventstore.ErrClosed) {
		return fmt.Errorf("%w: %w: %w", ErrClosed, messaging.ErrClosed, err)
	}
	return fmt.Errorf("%w: register %v in the store: %w", messaging.ErrInternal, d.id, err)
}

// Reset starts epoch req.Epoch of the registration from req.StartTs: the
// old epoch's queued and in-flight work is cancelled and its results
// discarded, and the new epoch begins with a handshake. An epoch that is
// not newer than the current one is refused with messaging.ErrStaleEpoch,
// so among concurrent resets the highest epoch wins.
//
// A start-ts below what the store may have collected for the dispatcher
// (its checkpoint, or its store registration's start) re-registers it in
// the store from the start-ts, here, on the control plane: the store then
// finds (or subscribes) a subscription that still holds those rows. If the
// store refuses, the reset stands and the registrar retries with the
// service's back-off; the new epoch sends its handshake and waits, since
// its frontier stays empty until the store registration exists.
func (svc *Service) Reset(ctx context.Context, req messaging.ResetRequest) error {
	if err := req.Validate(); err != nil {
		return err
	}
	if err := callerGone(ctx, "reset"); err != nil {
		return err
	}
	d, err := svc.lookupFor(ctx, req.Dispatcher, req.Registration, "reset")
	if err != nil {
		return err
	}
	s, err := svc.resetLocked(d, req)
	if err != nil {
		return err
	}
	svc.resets.Add(1)
	svc.request(s, false)
	return nil
}

func (svc *Service) resetLocked(d *dispatcher, req messaging.ResetRequest) (*session, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.mu.removed {
		return nil, fmt.Errorf("%w: %v", messaging.ErrUnknownDispatcher, d.id)
	}
	old := d.session.Load()
	if req.Epoch <= old.epoch {
		return nil, fmt.Errorf("%w: reset to epoch %d, current %d", messaging.ErrStaleEpoch, req.Epoch, old.epoch)
	}
	if req.Epoch-old.epoch > messaging.MaxEpochStep {
		svc.metrics.refusedControl.WithLabelValues(refusedEpochJump).Inc()
		return nil, fmt.Errorf("%w: reset to epoch %d, current %d: more than %d ahead", messaging.ErrInvalidRequest,
			req.Epoch, old.epoch, messaging.MaxEpochStep)
	}
	again := req.StartTs < d.mu.checkpoint || req.StartTs < d.mu.storeStart || d.mu.needRegister
	if again {
		// End the old store registration before the new session exists:
		// once Unregister returns the store calls d's notifier no more, so
		// no notification of the old registration can give the new epoch
		// a frontier its own registration has not confirmed. Unregister
		// waits for a callback in flight; the notify path takes no lock of
		// ours, so holding d.mu here cannot deadlock.
		d.mu.store = eventstore.Handle{}
		if err := svc.opts.Store.UnregisterDispatcher(d.id); err != nil && !errors.Is(err, eventstore.ErrDispatcherNotFound) {
			return nil, fmt.Errorf("%w: reset %v: end its store registration: %w", messaging.ErrInternal, d.id, err)
		}
		d.received.Store(0)
		d.maxCommit.Store(0)
	}
	s := newSession(d, req.Epoch, req.StartTs)
	d.session.Store(s)
	svc.retire(old)
	if again {
		d.mu.needRegister, d.mu.registerTs, d.mu.attempt = true, req.StartTs, 0
		svc.registerAgainLocked(d)
	}
	return s, nil
}

// registerAgainLocked registers d in the store from the start-ts a reset
// asked for; on failure the registrar retries after the next back-off.
// REQUIRES: d.mu held, d.mu.needRegister.
func (svc *Service) registerAgainLocked(d *dispatcher) {
	if err := svc.storeRegisterLocked(d, d.mu.registerTs); err != nil {
		svc.log.Warn("re-register in the store failed; retrying", zap.Stringer("dispatcher", d.id),
			zap.Int32("attempt", d.mu.attempt), zap.Error(err))
		svc.registrar.arm(d, svc.backoffDelay(int(d.mu.attempt)))
		if d.mu.attempt < 30 {
			d.mu.attempt++ // the delay is capped long before
		}
		return
	}
	d.mu.needRegister = false
	d.mu.storeStart, d.mu.checkpoint = d.mu.registerTs, d.mu.registerTs
}

// storeRegisterLocked registers d in the store from startTs and records
// the registration's handle, if the store gives handles. REQUIRES: d.mu
// held.
func (svc *Service) storeRegisterLocked(d *dispatcher, startTs common.Ts) error {
	if hs, ok := svc.opts.Store.(handleStore); ok {
		h, err := hs.RegisterDispatcherHandle(d.id, d.span.Span(), startTs, d)
		if err == nil {
			d.mu.store = h
		}
		return err
	}
	return svc.opts.Store.RegisterDispatcher(d.id, d.span.Span(), startTs, d)
}

// retryStoreRegistration is the registrar's retry of d's re-registration.
// A dispatcher removed meanwhile (by Remove or Close, which take d.mu) or
// registered by a later reset is left alone.
func (svc *Service) retryStoreRegistration(d *dispatcher) {
	svc.knobs.reach(pointBeforeReRegister, nil, d)
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.mu.removed || !d.mu.needRegister {
		return
	}
	svc.registerAgainLocked(d)
}

// Remove ends the registration: its queued and in-flight work is
// cancelled, and when Remove returns (1) the store calls its notifier no
// more and (2) no send of the registration is in progress and none will
// start: Remove waits for the owner of its session and for its target's
// resolved-ts delivery in flight (the fence). Sends never block, so the
// wait is bounded by one transport call.
func (svc *Service) Remove(ctx context.Context, req messaging.RemoveRequest) error {
	if err := req.Validate(); err != nil {
		return err
	}
	if err := callerGone(ctx, "remove"); err != nil {
		return err
	}
	d, err := svc.lookupFor(ctx, req.Dispatcher, req.Registration, "remove")
	if err != nil {
		return err
	}
	// The store registration ends before the ID leaves the map, so a
	// Register of the same ID meanwhile gets ErrDispatcherExists instead of
	// having its fresh store registration ended by this Remove.
	if err := svc.unregister(d); err != nil {
		return err
	}
	svc.fence(d)
	svc.forget(d)
	return nil
}

// unregister marks d removed and ends its store registration, unless a
// concurrent Remove or Close did. Store errors other than "closed" and
// "not found" are returned; d is removed either way.
func (svc *Service) unregister(d *dispatcher) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.mu.removed {
		return fmt.Errorf("%w: %v", messaging.ErrUnknownDispatcher, d.id) // a concurrent Remove won
	}
	if err := svc.unregisterLocked(d); err != nil {
		return fmt.Errorf("%w: remove %v: %w", messaging.ErrInternal, d.id, err)
	}
	return nil
}

// fence waits until no send of d, which is removed (its sessions retired),
// is in progress. An owner checks, under d.sendMu, that its session is not
// retired before it sends; the pump filters out retired sessions under
// t.deliverMu. Taking each lock once, after the retirement, therefore
// waits for the one send that may have passed its check before it, and
// every later one sees the retirement and sends nothing.
func (svc *Service) fence(d *dispatcher) {
	svc.knobs.reach(pointBeforeFence, nil, d)
	d.sendMu.Lock()
	d.sendMu.Unlock() //nolint:staticcheck // an empty critical section is the fence
	d.target.deliverMu.Lock()
	d.target.deliverMu.Unlock() //nolint:staticcheck // likewise
}

// unregisterLocked marks d removed, retires its session and ends its store
// registration; when it returns the store calls d's notifier no more, and
// the registrar cannot register d again (retryStoreRegistration checks
// removed under d.mu). A dispatcher the store does not know (a failed
// re-registration) counts as unregistered. REQUIRES: d.mu held.
func (svc *Service) unregisterLocked(d *dispatcher) error {
	d.mu.removed = true
	d.mu.store = eventstore.Handle{}
	svc.retire(d.session.Load())
	err := svc.opts.Store.UnregisterDispatcher(d.id)
	if err != nil && !errors.Is(err, eventstore.ErrClosed) && !errors.Is(err, eventstore.ErrDispatcherNotFound) {
		return err
	}
	return nil
}

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
// from the pool when one there is long enough. A million dispatchers'
// heartbeats allocated one per call, a seventh of what the process
// allocated at that size (GC cycles of seconds each).
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

// lookupFor returns the dispatcher of id if its registration is reg and
// ctx's authority may act for its target.
func (svc *Service) lookupFor(ctx context.Context, id common.DispatcherID, reg messaging.RegistrationID, op string) (*dispatcher, error) {
	d, err := svc.lookup(id, reg)
	if err != nil {
		return nil, err
	}
	if auth := messaging.AuthorityOf(ctx); !messaging.MayServe(auth, d.target.name) {
		return nil, svc.denied(auth, d.target.name, op)
	}
	return d, nil
}

// denied counts and builds the refusal of op on target to auth. The
// message names the target only when the caller named it: a dispatcher's
// current target is not the caller's business.
func (svc *Service) denied(auth messaging.Authority, target messaging.Target, op string) error {
	svc.metrics.refusedControl.WithLabelValues(refusedPermission).Inc()
	if op == "register" {
		return fmt.Errorf("%w: %q may not register under target %q", messaging.ErrPermissionDenied, auth.Identity(), target)
	}
	return fmt.Errorf("%w: %q may not %s: it is another target's", messaging.ErrPermissionDenied, auth.Identity(), op)
}

// lookup returns the dispatcher of id if its registration is reg.
func (svc *Service) lookup(id common.DispatcherID, reg messaging.RegistrationID) (*dispatcher, error) {
	d, err := svc.lookupID(id)
	if err != nil {
		return nil, err
	}
	if d.reg != reg {
		return nil, fmt.Errorf("%w: %v registration %v, current %v", messaging.ErrStaleRegistration, id, reg, d.reg)
	}
	return d, nil
}

// lookupID returns the dispatcher registered under id, whatever its
// registration (for diagnostics).
func (svc *Service) lookupID(id common.DispatcherID) (*dispatcher, error) {
	svc.mu.RLock()
	defer svc.mu.RUnlock()
	if svc.mu.closed {
		return nil, closedError("lookup")
	}
	d, ok := svc.mu.dispatchers.Lookup(id)
	if !ok {
		return nil, fmt.Errorf("%w: %v", messaging.ErrUnknownDispatcher, id)
	}
	return d, nil
}

// closedError is the error of a control-plane call on a closed service.
func closedError(op string) error {
	return fmt.Errorf("%w: %w: %s", ErrClosed, messaging.ErrClosed, op)
}

// callerGone refuses a control call whose context has already ended: the
// caller gave up (a deadline, a cancelled stream), so acting on it would
// change the service behind the back of someone who reports failure. The
// error is messaging.ErrUnavailable wrapping the context's, as a remote
// call that ran out of time is, and nothing was done. Once a call has
// started it runs to its end: each is bounded (a Remove waits for at most
// one transport call), and stopping one half-way would leave it undone in
// an unknown place.
func callerGone(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%w: %s: the caller gave up: %w", messaging.ErrUnavailable, op, err)
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
// subscription (a lock and two cold cache lines at a million dispatchers:
// 8.6% of a 1M run's CPU). The first checkpoint past a row goes to the store,
// whatever came before, so collection follows rows as before.
func storeNeedsCheckpoint(prev, maxCommit common.Ts) bool { return maxCommit > prev }

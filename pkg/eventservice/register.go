package eventservice

import (
	"context"
	"errors"
	"fmt"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

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

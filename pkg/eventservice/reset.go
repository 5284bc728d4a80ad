package eventservice

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

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

package eventservice

import (
	"context"
	"fmt"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// The service's side of the control plane: Service implements
// messaging.ControlPlane. Errors wrap messaging's control-plane sentinels
// (so a network transport can carry them as a messaging.Code) and, where
// the service has a sentinel of its own (ErrClosed), that one too.
var _ messaging.ControlPlane = (*Service)(nil)

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

package eventservice

import (
	"context"
	"errors"
	"fmt"

	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

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

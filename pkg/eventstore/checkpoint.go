package eventstore

import (
	"fmt"
	"time"

	"github.com/cdcflow/eventservice/pkg/common"
)

// Checkpoints: what a dispatcher no longer needs, which is what GC may
// delete (see "Checkpoints and GC" in docs/design/eventstore.md).

// UpdateCheckpoint records that dispatcher id needs no row at or below ts
// any more. Checkpoints only move forward (a lower ts is ignored) and are
// capped at the subscription's resolved-ts. GC deletes rows below the
// minimum checkpoint of a subscription's dispatchers.
func (s *Store) UpdateCheckpoint(id common.DispatcherID, ts common.Ts) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	sb, err := s.subscriberLocked(id)
	if err != nil {
		return err
	}
	s.updateCheckpoint(sb, ts)
	return nil
}

// subscriberLocked returns dispatcher id's registration: ErrClosed once the
// store closed, ErrDispatcherNotFound for an ID it does not have.
// REQUIRES: s.mu held (read).
func (s *Store) subscriberLocked(id common.DispatcherID) (*subscriber, error) {
	if s.mu.closed {
		return nil, ErrClosed
	}
	sb, ok := s.mu.dispatchers.Lookup(id)
	if !ok {
		return nil, fmt.Errorf("%w: %v", ErrDispatcherNotFound, id)
	}
	return sb, nil
}

// Handle is a registered dispatcher's handle for checkpoint updates without
// a lookup by ID: the lookup is a map probe on a 16-byte ID under the
// store's lock, a cold cache line at a million dispatchers. It is valid
// until the dispatcher is unregistered; its UpdateCheckpoint then fails
// with ErrDispatcherNotFound, as the ID's would. A later registration of
// the same ID has a handle of its own. The zero Handle is no registration
// (Valid reports false). It is one pointer: the store is the registration's
// subscription's (set before any handle is given), so a service that keeps
// a handle per dispatcher keeps 8 bytes, not 16.
type Handle struct {
	sb *subscriber
}

// Handle returns the handle of dispatcher id's current registration.
func (s *Store) Handle(id common.DispatcherID) (Handle, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	sb, err := s.subscriberLocked(id)
	if err != nil {
		return Handle{}, err
	}
	return Handle{sb: sb}, nil
}

// Valid reports whether h was given by Store.Handle.
func (h Handle) Valid() bool { return h.sb != nil }

// UpdateCheckpoint is Store.UpdateCheckpoint of h's registration.
func (h Handle) UpdateCheckpoint(ts common.Ts) error {
	if h.sb == nil {
		return fmt.Errorf("%w: zero handle", ErrInvalidArgument)
	}
	s := h.sb.sub.store
	if s.isClosing() {
		return ErrClosed
	}
	if !s.updateCheckpoint(h.sb, ts) {
		return fmt.Errorf("%w: %v (unregistered)", ErrDispatcherNotFound, h.sb.id)
	}
	return nil
}

// updateCheckpoint raises sb's checkpoint to ts (capped at its
// subscription's resolved-ts) and schedules the GC it allows; false if sb
// was unregistered.
func (s *Store) updateCheckpoint(sb *subscriber, ts common.Ts) bool {
	sub := sb.sub
	sub.mu.Lock()
	defer sub.mu.Unlock()
	if sb.detached {
		return false
	}
	ts = min(ts, sub.mu.resolved)
	if ts > sb.checkpoint {
		// The GC target is at least the subscribers' minimum checkpoint
		// (a change of the subscribers, or the last checkpoint at or below
		// the target passing it, recomputes it), so a subscriber above the
		// target held no minimum, and raising it cannot move the target;
		// nor can passing the target while another subscriber is still at
		// or below it (atTarget). Only the last one to pass it compares
		// with the others': with two changefeeds in step, each advance read
		// the other changefeed's subscriber, a cold cache line at 100k
		// tables, where now only the second of the two does.
		held := sb.checkpoint <= sub.mu.gcTarget
		sb.checkpoint = ts
		if held && ts > sub.mu.gcTarget {
			if sub.mu.atTarget--; sub.mu.atTarget <= 0 {
				sub.recomputeGCLocked()
			}
		}
		s.trimFreshLocked(sub, sub.mu.gcTarget)
		s.noteGCLocked(sub, time.Time{})
	}
	return true
}

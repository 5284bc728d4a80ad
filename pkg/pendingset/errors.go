package pendingset

import (
	"errors"
	"fmt"
)

// Sentinel errors. Every error this package returns wraps one of these, so
// callers test with errors.Is.
var (
	// ErrInvalidOptions: Options failed validation. Validate joins one
	// wrapped error per bad field.
	ErrInvalidOptions = errors.New("pendingset: invalid options")
	// ErrInvalidArgument: a nil Set or deliver function, and the like.
	ErrInvalidArgument = errors.New("pendingset: invalid argument")
	// ErrNotInFlight: Complete was given an entry that is not an in-flight
	// entry of this set (completed twice, or never drained). Such entries are
	// skipped; the rest of the batch is completed.
	ErrNotInFlight = errors.New("pendingset: entry not in flight")
	// ErrInvalidResult: an entry carried a Result outside the defined
	// constants. The key is kept and retried without spending budget.
	ErrInvalidResult = errors.New("pendingset: invalid result")
	// ErrAlreadyStarted: Start was called twice.
	ErrAlreadyStarted = errors.New("pendingset: pump already started")
	// ErrNotStarted: Drain was called on a pump that was never started.
	ErrNotStarted = errors.New("pendingset: pump not started")
	// ErrStopped: the pump was stopped; it cannot be started again, and a
	// Drain interrupted by Stop reports it.
	ErrStopped = errors.New("pendingset: pump stopped")
	// ErrBusy: a DeliverFunc wraps it to say its target refused the batch
	// for routine back-pressure (it is full for now). The batch fails as a
	// whole like any error, but the pump logs it at debug, not warn: a busy
	// target is the normal state of a fast producer.
	ErrBusy = errors.New("pendingset: target busy")
	// ErrPermanent: a DeliverFunc wraps it (see Permanent) to say that its
	// whole-batch failure will not go away by retrying the same batch:
	// something in the batch is bad (a payload over the target's limit,
	// say). The pump then bisects the batch to isolate the bad keys, which
	// spend budget and end in quarantine, and delivers every other key.
	ErrPermanent = errors.New("pendingset: permanent batch failure")
	// ErrDeliveryTimeout: a delivery ran past Options.DeliveryTimeout; the
	// batch failed as a whole (kept, retried after the pump's backoff).
	ErrDeliveryTimeout = errors.New("pendingset: delivery timed out")
	// ErrQuarantined: a drain finished while keys were still quarantined;
	// they stay in the set, undelivered.
	ErrQuarantined = errors.New("pendingset: keys left in quarantine")
)

// Permanent marks err as a permanent whole-batch failure: the returned
// error wraps both err and ErrPermanent. Nil stays nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrPermanent, err)
}

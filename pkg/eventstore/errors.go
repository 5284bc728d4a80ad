package eventstore

import "errors"

// Sentinel errors. Every error the store returns wraps one of these, so
// callers test with errors.Is.
var (
	// ErrClosed: the store is closed or closing.
	ErrClosed = errors.New("eventstore: closed")
	// ErrInvalidOptions: Options failed validation.
	ErrInvalidOptions = errors.New("eventstore: invalid options")
	// ErrDispatcherExists: the dispatcher ID is already registered.
	ErrDispatcherExists = errors.New("eventstore: dispatcher already registered")
	// ErrDispatcherNotFound: the dispatcher ID is not registered.
	ErrDispatcherNotFound = errors.New("eventstore: dispatcher not found")
	// ErrInvalidArgument: a zero dispatcher ID, a nil notifier, and the like.
	ErrInvalidArgument = errors.New("eventstore: invalid argument")
	// ErrRowBeforeResolved: a row's commit-ts is at or below the
	// subscription's resolved-ts.
	ErrRowBeforeResolved = errors.New("eventstore: row commit-ts at or below resolved-ts")
	// ErrRowOutsideSpan: a row's key lies outside the subscription's span.
	ErrRowOutsideSpan = errors.New("eventstore: row key outside span")
	// ErrInvalidRow: a row with an unknown op, an empty key, or start-ts >= commit-ts.
	ErrInvalidRow = errors.New("eventstore: invalid row")
	// ErrResolvedTsRegressed: a resolved-ts below the subscription's current one.
	ErrResolvedTsRegressed = errors.New("eventstore: resolved-ts regressed")
	// ErrRangeBelowCheckpoint: a scan starts below the dispatcher's checkpoint,
	// where data may already be garbage collected.
	ErrRangeBelowCheckpoint = errors.New("eventstore: scan range starts below checkpoint")
	// ErrRangeAboveResolved: a scan ends above the subscription's resolved-ts,
	// where data may not be complete yet.
	ErrRangeAboveResolved = errors.New("eventstore: scan range ends above resolved-ts")
	// ErrInvalidRange: a scan range whose start is after its end, or a cursor
	// outside the range.
	ErrInvalidRange = errors.New("eventstore: invalid scan range")
	// ErrCorrupt: a stored key or value failed to decode.
	ErrCorrupt = errors.New("eventstore: corrupt entry")
	// ErrSubscriptionClosed is returned by SinkGuard.Push (and for its guard
	// by PushResolvedGuarded) once the guard's Close has begun.
	ErrSubscriptionClosed = errors.New("eventstore: subscription closed")
)

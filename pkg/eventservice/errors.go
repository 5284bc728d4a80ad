package eventservice

import "errors"

// Sentinel errors; every error the service returns wraps one of them.
var (
	// ErrClosed: the service is closed or closing.
	ErrClosed = errors.New("eventservice: closed")
	// ErrNotStarted: an operation that needs Start was called before it.
	ErrNotStarted = errors.New("eventservice: not started")
	// ErrInvalidOptions: Options failed validation.
	ErrInvalidOptions = errors.New("eventservice: invalid options")
	// ErrInvalidArgument: a zero dispatcher ID, an invalid span, an empty
	// target, epoch zero, and the like.
	ErrInvalidArgument = errors.New("eventservice: invalid argument")
	// ErrDispatcherExists: Register of an ID that is registered.
	ErrDispatcherExists = errors.New("eventservice: dispatcher already registered")
	// ErrUnknownDispatcher: the ID is not registered.
	ErrUnknownDispatcher = errors.New("eventservice: unknown dispatcher")
	// ErrStaleEpoch: a reset or heartbeat for an epoch that is not newer
	// (reset) or not current (heartbeat).
	ErrStaleEpoch = errors.New("eventservice: stale epoch")
)

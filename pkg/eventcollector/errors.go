package eventcollector

import "errors"

// Sentinel errors. Every error the package returns wraps one of them (or an
// error of the service, wrapped with %w so errors.Is still finds it).
var (
	// ErrInvalidOptions: Options failed validation.
	ErrInvalidOptions = errors.New("eventcollector: invalid options")
	// ErrInvalidArgument: a zero dispatcher ID or an invalid span.
	ErrInvalidArgument = errors.New("eventcollector: invalid argument")
	// ErrDispatcherExists: AddDispatcher of an ID the collector already has.
	ErrDispatcherExists = errors.New("eventcollector: dispatcher already added")
	// ErrUnknownDispatcher: the ID is not (or no longer) one of the
	// collector's dispatchers.
	ErrUnknownDispatcher = errors.New("eventcollector: unknown dispatcher")
	// ErrClosed: the collector is closed.
	ErrClosed = errors.New("eventcollector: closed")
)

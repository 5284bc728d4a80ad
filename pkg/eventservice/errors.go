package eventservice

import "errors"

// Sentinel errors. Every error the service returns wraps one of them or
// one of messaging's control-plane sentinels (messaging.ErrInvalidRequest,
// ErrDispatcherExists, ErrUnknownDispatcher, ErrStaleRegistration,
// ErrStaleEpoch, ErrInternal): the control plane is messaging's protocol,
// so its errors are messaging's, which a network transport carries as a
// messaging.Code.
var (
	// ErrClosed: the service is closed or closing. Control-plane calls on
	// a closed service wrap messaging.ErrClosed too.
	ErrClosed = errors.New("eventservice: closed")
	// ErrInvalidOptions: Options failed validation.
	ErrInvalidOptions = errors.New("eventservice: invalid options")
)

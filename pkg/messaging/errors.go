package messaging

import "errors"

// Sentinel errors. Every error the package returns wraps one of these.
var (
	// ErrBusy: the target's inbound queue has no room for the batch right
	// now. Nothing was delivered. This is normal back-pressure: back off and
	// retry later. Returned unwrapped so the hot refusal path does not
	// allocate.
	ErrBusy = errors.New("messaging: target busy")
	// ErrBatchTooLarge: the batch exceeds the target's whole capacity and
	// would never be accepted; split it. Nothing was delivered.
	ErrBatchTooLarge = errors.New("messaging: batch larger than target capacity")
	// ErrUnknownTarget: no receiver is registered under the target name.
	ErrUnknownTarget = errors.New("messaging: unknown target")
	// ErrTargetExists: Register of a target that is already registered.
	ErrTargetExists = errors.New("messaging: target already registered")
	// ErrInvalidTarget: a target name that fails Target.Validate.
	ErrInvalidTarget = errors.New("messaging: invalid target")
	// ErrClosed: the transport (or, for a receiver, its inbox) is closed.
	ErrClosed = errors.New("messaging: closed")
	// ErrSendFailed: the transport failed to deliver; nothing was delivered.
	ErrSendFailed = errors.New("messaging: send failed")
	// ErrInvalidMessage: a nil message, or one that fails Validate.
	ErrInvalidMessage = errors.New("messaging: invalid message")
	// ErrInvalidOptions: options failed validation.
	ErrInvalidOptions = errors.New("messaging: invalid options")

	// Control-plane errors (ControlPlane; each has a Code).

	// ErrInvalidRequest: a control-plane request that fails its Validate.
	ErrInvalidRequest = errors.New("messaging: invalid request")
	// ErrUnavailable: the other side cannot take the request now (not
	// started, unreachable); retry later.
	ErrUnavailable = errors.New("messaging: unavailable")
	// ErrDispatcherExists: Register of a dispatcher ID that has another live
	// registration.
	ErrDispatcherExists = errors.New("messaging: dispatcher already registered")
	// ErrUnknownDispatcher: the dispatcher ID has no registration.
	ErrUnknownDispatcher = errors.New("messaging: unknown dispatcher")
	// ErrStaleRegistration: the dispatcher ID's registration is not the
	// request's; nothing changed.
	ErrStaleRegistration = errors.New("messaging: stale registration")
	// ErrStaleEpoch: a reset to an epoch that is not above the current one,
	// or a checkpoint of an epoch that is not the current one.
	ErrStaleEpoch = errors.New("messaging: stale epoch")
	// ErrInternal: the other side failed for a reason of its own.
	ErrInternal = errors.New("messaging: internal error")
	// ErrPermissionDenied: the caller's identity may not act for the
	// target (or the dispatcher's current target) the request names.
	ErrPermissionDenied = errors.New("messaging: permission denied")
	// ErrLimitExceeded: the request would take the other side past one of
	// its bounds (targets, dispatchers per target); nothing changed. Retry
	// after something was removed, or raise the bound.
	ErrLimitExceeded = errors.New("messaging: limit exceeded")
)

package messaging

import (
	"context"
	"errors"
	"fmt"

	"github.com/cdcflow/eventservice/pkg/common"
)

// RegistrationID identifies one registration of a dispatcher: the interval
// from a Register to the Remove that ends it. The collector chooses it
// (NewRegistrationSource) before it registers, so it can accept the first
// message of the registration the moment it arrives; no registration of
// the same dispatcher ID shares it, so a message or a control request of an
// earlier registration (a table that moved away and back) can be told
// apart and ignored. Zero is invalid.
type RegistrationID uint64

// String returns the ID in hex.
func (r RegistrationID) String() string { return fmt.Sprintf("%016x", uint64(r)) }

// IsZero reports whether r is the invalid zero ID.
func (r RegistrationID) IsZero() bool { return r == 0 }

// RegisterRequest asks the service to start delivering Span to Target as
// dispatcher Dispatcher, registration Registration, from StartTs
// (exclusive). The registration's first epoch is 1: its handshake is
// (Registration, epoch 1, seq 1).
type RegisterRequest struct {
	Dispatcher   common.DispatcherID
	Registration RegistrationID
	Span         common.Span
	StartTs      common.Ts
	Target       Target
	// Replace takes the dispatcher over if the service has it under
	// another registration: that registration is removed first (its
	// fence holds) and this one starts. A collector that restarted, or
	// whose connection broke, sets it to re-register its dispatchers from
	// their checkpoints under new registration IDs without knowing the
	// old ones. Without it such a request fails with ErrDispatcherExists.
	Replace bool
	// Slot is the receiver's index of the dispatcher (zero: none). The
	// service echoes it in the dispatcher's resolved-ts (Resolved.Slot), so
	// that a receiver with very many dispatchers finds each by index, not
	// by a map probe on its ID. The service does not interpret it.
	Slot uint32
}

// Validate checks r on its own. Errors wrap ErrInvalidRequest.
func (r RegisterRequest) Validate() error {
	var errs []error
	errs = append(errs, checkIdentity(r.Dispatcher, r.Registration)...)
	if err := r.Span.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrInvalidRequest, err))
	}
	if err := r.Target.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrInvalidRequest, err))
	}
	return errors.Join(errs...)
}

// MaxRegisterBatch bounds a RegisterBatchRequest: a thousand table
// registrations encode to about 200 KiB, within a network message. A
// collector with more dispatchers sends several.
const MaxRegisterBatch = 1024

// RegisterBatchRequest registers many dispatchers in one call, each entry
// as a Register of its own would (a collector adding a changefeed's
// tables, or registering them again after a reconnect, pays one round
// trip per batch, not one per table).
type RegisterBatchRequest struct {
	Requests []RegisterRequest
}

// Validate checks the request's size. Entries are judged one by one by the
// service (RegisterBatchReply.Codes), so one bad entry does not refuse the
// others. Errors wrap ErrInvalidRequest.
func (r RegisterBatchRequest) Validate() error {
	if n := len(r.Requests); n == 0 || n > MaxRegisterBatch {
		return fmt.Errorf("%w: %d registrations in one batch, 1 to %d", ErrInvalidRequest, n, MaxRegisterBatch)
	}
	return nil
}

// RegisterBatchReply answers a RegisterBatchRequest entry by entry:
// Codes[i] is the outcome of Requests[i], as Register's error's code.
type RegisterBatchReply struct {
	Codes []Code
}

// RegisterEach answers req with one register call per entry, in order: the
// RegisterBatch of a control plane with nothing to share between entries.
func RegisterEach(ctx context.Context, register func(context.Context, RegisterRequest) error, req RegisterBatchRequest) (RegisterBatchReply, error) {
	if err := req.Validate(); err != nil {
		return RegisterBatchReply{}, err
	}
	reply := RegisterBatchReply{Codes: make([]Code, len(req.Requests))}
	for i, r := range req.Requests {
		reply.Codes[i] = CodeOf(register(ctx, r))
	}
	return reply, nil
}

// ResetRequest asks the service to start epoch Epoch of the registration
// from StartTs: the old epoch's queued and in-flight work is discarded and
// the new epoch opens with a handshake. Epoch must be above the current
// one (ErrStaleEpoch otherwise).
type ResetRequest struct {
	Dispatcher   common.DispatcherID
	Registration RegistrationID
	Epoch        uint64
	StartTs      common.Ts
}

// Validate checks r on its own. Errors wrap ErrInvalidRequest.
func (r ResetRequest) Validate() error {
	errs := checkIdentity(r.Dispatcher, r.Registration)
	if r.Epoch < 2 {
		errs = append(errs, fmt.Errorf("%w: reset to epoch %d (a registration starts at epoch 1)", ErrInvalidRequest, r.Epoch))
	}
	return errors.Join(errs...)
}

// RemoveRequest ends a registration. When Remove returns nil, no send of
// the registration is in progress and none will start (the fence), and the
// store no longer notifies it.
type RemoveRequest struct {
	Dispatcher   common.DispatcherID
	Registration RegistrationID
}

// Validate checks r on its own. Errors wrap ErrInvalidRequest.
func (r RemoveRequest) Validate() error {
	return errors.Join(checkIdentity(r.Dispatcher, r.Registration)...)
}

// DispatcherCheckpoint is one dispatcher's checkpoint in a heartbeat: every
// change at or below Ts was applied downstream in epoch Epoch of the
// registration.
type DispatcherCheckpoint struct {
	Dispatcher   common.DispatcherID
	Registration RegistrationID
	Epoch        uint64
	Ts           common.Ts
	// Slot echoes the service's slot of the dispatcher (Handshake.Slot;
	// zero: none), a hint the service checks against Dispatcher.
	Slot uint32
}

// MaxHeartbeatCheckpoints bounds one HeartbeatRequest, so that a request
// fits a network message (about 52 bytes an entry: about 420 KiB). A
// collector with more dispatchers sends several.
const MaxHeartbeatCheckpoints = 8192

// HeartbeatRequest carries many dispatchers' checkpoints in one call.
type HeartbeatRequest struct {
	Checkpoints []DispatcherCheckpoint
}

// Validate checks the request's size. Entries are judged one by one by the
// service (HeartbeatReply.Codes), so one bad entry does not refuse the
// others. Errors wrap ErrInvalidRequest.
func (r HeartbeatRequest) Validate() error {
	if len(r.Checkpoints) > MaxHeartbeatCheckpoints {
		return fmt.Errorf("%w: %d checkpoints in one heartbeat, at most %d", ErrInvalidRequest, len(r.Checkpoints), MaxHeartbeatCheckpoints)
	}
	return nil
}

// HeartbeatReply answers a HeartbeatRequest entry by entry: Codes[i] is the
// outcome of Checkpoints[i] (CodeOK: recorded, or not above the one
// recorded; CodeStaleEpoch: a reset is under way, report again later;
// CodeUnknownDispatcher, CodeStaleRegistration: the registration is gone).
type HeartbeatReply struct {
	Codes []Code
}

// ControlPlane is the event service's control plane: the requests a
// collector makes of the service. It is a protocol, not a Go call graph:
// requests and replies are plain values (no pointers into either side, no
// callbacks), errors are the sentinels below (a network carries them as a
// Code), so a collector can live in another process. The event service
// implements it; in-process wiring passes the service itself.
//
// Errors (test with errors.Is, or map with CodeOf):
//   - ErrInvalidRequest: the request fails its Validate.
//   - ErrClosed: the service is closed; ErrNotStarted-like conditions of
//     an implementation wrap ErrUnavailable (try again later).
//   - ErrDispatcherExists: Register of an ID with another live
//     registration (Register repeating the current registration is
//     accepted: a retried request is harmless).
//   - ErrUnknownDispatcher: the ID has no registration.
//   - ErrStaleRegistration: the ID's registration is not the request's (a
//     late request of a registration that was removed); nothing changed.
//   - ErrStaleEpoch: a reset to an epoch that is not above the current one.
type ControlPlane interface {
	Register(ctx context.Context, req RegisterRequest) error
	// RegisterBatch registers each entry as Register would. Its error is
	// the call's (an invalid batch, or one that never reached the
	// service); the entries' outcomes are the reply's codes.
	RegisterBatch(ctx context.Context, req RegisterBatchRequest) (RegisterBatchReply, error)
	Reset(ctx context.Context, req ResetRequest) error
	Remove(ctx context.Context, req RemoveRequest) error
	Heartbeat(ctx context.Context, req HeartbeatRequest) (HeartbeatReply, error)
}

func checkIdentity(id common.DispatcherID, reg RegistrationID) []error {
	var errs []error
	if id.IsZero() {
		errs = append(errs, fmt.Errorf("%w: zero dispatcher id", ErrInvalidRequest))
	}
	if reg.IsZero() {
		errs = append(errs, fmt.Errorf("%w: zero registration id", ErrInvalidRequest))
	}
	return errs
}

// Code is a control-plane outcome as a network carries it: one per
// sentinel. The set is closed and small.
type Code uint8

// Codes.
const (
	CodeOK Code = iota
	CodeInvalidRequest
	CodeClosed
	CodeUnavailable
	CodeDispatcherExists
	CodeUnknownDispatcher
	CodeStaleRegistration
	CodeStaleEpoch
	// CodeInternal: any other failure (the store failed, say).
	CodeInternal
	CodePermissionDenied
	CodeLimitExceeded
	numCodes
)

var codeSentinels = [numCodes]error{nil, ErrInvalidRequest, ErrClosed, ErrUnavailable, ErrDispatcherExists,
	ErrUnknownDispatcher, ErrStaleRegistration, ErrStaleEpoch, ErrInternal, ErrPermissionDenied, ErrLimitExceeded}

var codeNames = [numCodes]string{"ok", "invalid_request", "closed", "unavailable", "dispatcher_exists",
	"unknown_dispatcher", "stale_registration", "stale_epoch", "internal", "permission_denied", "limit_exceeded"}

// String returns the code's name (a safe metric label).
func (c Code) String() string {
	if c < numCodes {
		return codeNames[c]
	}
	return fmt.Sprintf("code(%d)", uint8(c))
}

// Err returns the sentinel of c: nil for CodeOK, ErrInternal for a code
// this version does not know.
func (c Code) Err() error {
	if c < numCodes {
		return codeSentinels[c]
	}
	return ErrInternal
}

// CodeOf maps an error to its Code: CodeOK for nil, the code of the first
// sentinel it wraps, else CodeInternal.
func CodeOf(err error) Code {
	if err == nil {
		return CodeOK
	}
	for c := CodeInvalidRequest; c < numCodes; c++ {
		if s := codeSentinels[c]; s != nil && errors.Is(err, s) {
			return c
		}
	}
	return CodeInternal
}

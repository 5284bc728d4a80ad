package messaging

import "context"

// Authority is what the caller of a control-plane request may act for: the
// targets whose dispatchers it may register, reset, remove, take over and
// heartbeat. A network transport derives it from what the peer proved (its
// TLS certificate) and attaches it to the request's context
// (WithAuthority); the control plane checks it against the request's
// target and, for a request about an existing registration, against that
// registration's target, under the same lock that decides the request. A
// refusal is ErrPermissionDenied.
//
// A context without an Authority is an in-process caller, which may act
// for every target.
type Authority interface {
	// Identity names the caller in errors and logs (a certificate's SAN).
	Identity() string
	// MayServe reports whether the caller may act for target.
	MayServe(target Target) bool
}

type authorityKey struct{}

// WithAuthority returns ctx carrying a: the control plane refuses what a
// may not do.
func WithAuthority(ctx context.Context, a Authority) context.Context {
	return context.WithValue(ctx, authorityKey{}, a)
}

// AuthorityOf returns the Authority ctx carries, or nil for a caller
// without one (in process: unrestricted).
func AuthorityOf(ctx context.Context) Authority {
	a, _ := ctx.Value(authorityKey{}).(Authority)
	return a
}

// MayServe reports whether a may act for target: a nil Authority may act
// for every target.
func MayServe(a Authority, target Target) bool { return a == nil || a.MayServe(target) }

// MaxEpochStep bounds how far a ResetRequest may move a registration's
// epoch past its current one. A collector moves one epoch above the
// highest it has seen per reset; a request far beyond that is a confused
// or hostile peer, and accepting it (up to 2^64-1) would leave the
// registration unable to reset ever again. Such a request is
// ErrInvalidRequest.
const MaxEpochStep = 1 << 16

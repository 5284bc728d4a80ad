package remote

import "errors"

// Sentinel errors. Most errors the package returns wrap one of
// messaging's sentinels (ErrInvalidOptions, ErrUnavailable, ...); these
// are the wire's own.
var (
	// ErrMalformed: a frame that does not decode. Whoever receives one drops
	// the stream (the peer speaks another protocol or is broken).
	ErrMalformed = errors.New("remote: malformed frame")
	// ErrVersionMismatch: the peer speaks another version of the wire. A
	// client's call that fails with it wraps messaging.ErrInvalidRequest too
	// (retrying cannot help).
	ErrVersionMismatch = errors.New("remote: wire version mismatch")
)

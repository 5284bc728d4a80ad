package pgnotify

import "errors"

// Sentinel errors; every error the package returns wraps one of them.
var (
	// ErrInvalidOptions: Options or ListenOptions failed validation.
	ErrInvalidOptions = errors.New("pgnotify: invalid options")
	// ErrPayloadTooLarge: a payload of MaxPayloadBytes+1 bytes or more.
	ErrPayloadTooLarge = errors.New("pgnotify: payload too large")
	// ErrInvalidPayload: a payload with a NUL byte or invalid UTF-8, which
	// PostgreSQL refuses (SQLSTATE 22021) for the whole batch carrying it.
	ErrInvalidPayload = errors.New("pgnotify: invalid payload")
	// ErrInvalidChannel: a channel that is empty, over 63 bytes, or holds
	// a NUL byte or invalid UTF-8.
	ErrInvalidChannel = errors.New("pgnotify: invalid channel")
	// ErrClosed: Start or Publish after Close.
	ErrClosed = errors.New("pgnotify: publisher closed")
)

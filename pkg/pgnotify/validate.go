package pgnotify

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
)

// What Publish and Listen refuse, and why here rather than at the server:
// a notification PostgreSQL refuses fails the whole statement that carries
// it, and a statement carries a batch of up to MaxBatch. Input the client
// can recognise as bad is refused before it is queued, where the caller
// still knows it; what only the server can judge is classified in deliver
// (isDataException).

// checkChannel accepts what pg_notify and LISTEN accept as a channel in a
// UTF8 database: 1 to 63 bytes, no NUL, valid UTF-8.
func checkChannel(channel string) error {
	if channel == "" || len(channel) > maxChannelBytes {
		return fmt.Errorf("%w: %d bytes (1 to %d)", ErrInvalidChannel, len(channel), maxChannelBytes)
	}
	if at := badText(channel); at >= 0 {
		return fmt.Errorf("%w: %q: NUL or invalid UTF-8 at byte %d", ErrInvalidChannel, channel, at)
	}
	return nil
}

// checkPayload accepts what pg_notify accepts as a payload: under 8000
// bytes, no NUL, valid UTF-8. The channel is only named in the message.
func checkPayload(channel, payload string) error {
	if len(payload) > MaxPayloadBytes {
		return fmt.Errorf("%w: %d bytes on channel %q, at most %d", ErrPayloadTooLarge, len(payload), channel, MaxPayloadBytes)
	}
	if at := badText(payload); at >= 0 {
		// The payload itself is not quoted: it may be 8 kB of anything.
		return fmt.Errorf("%w: NUL or invalid UTF-8 at byte %d of %d on channel %q", ErrInvalidPayload, at, len(payload), channel)
	}
	return nil
}

// badText returns the offset of the first NUL byte or invalid UTF-8
// sequence in s, or -1 when there is none. These are what PostgreSQL's
// input check (pg_verify_mbstr) refuses in a UTF8 database, with SQLSTATE
// 22021, and Go's UTF-8 rules (no surrogates, nothing above U+10FFFF, no
// overlong forms) are the same as PostgreSQL's. Publish runs it on every
// call, so the common case is two vectorised scans and no decoding.
func badText(s string) int {
	if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
		return -1
	}
	for i, r := range s {
		if r == 0 {
			return i
		}
		if r == utf8.RuneError {
			if _, w := utf8.DecodeRuneInString(s[i:]); w == 1 { // not a literal U+FFFD
				return i
			}
		}
	}
	return -1 // unreachable: one of the scans above found something
}

// isDataException reports whether err is a PostgreSQL error of SQLSTATE
// class 22, "data exception". The notify statement's text is a constant,
// so such an error can only come from the values it carries: some entry's
// channel or payload (invalid byte sequences, 22021; characters the
// database's encoding has no equivalent for, 22P05; a payload or channel
// too long once converted to that encoding, 22023). Retrying the same
// values fails the same way, so the failure is permanent for the entry
// that causes it, and bisection finds that entry. Errors of other classes
// (a full notification queue, 54000; a read-only standby, 25006; a
// shutting-down server, 57P01) belong to the server's state: every entry
// would fail alike, and they are retried.
func isDataException(err error) (*pgconn.PgError, bool) {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22") {
		return pgErr, true
	}
	return nil, false
}

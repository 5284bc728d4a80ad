// Package pglink says what a failed operation on a PostgreSQL server tells
// an operator, and logs a link's outages once: Cause is an error's cause
// without pgx's fallback noise (under sslmode=prefer a server without TLS
// adds "tls error: server refused TLS connection" to every connection
// error), Classify names a server that is shutting down, starting up, in
// recovery or terminated the session, and Watch logs the first failure of
// an outage, a change of its condition and the return, each once.
//
// Invariants: Cause and Classify are pure; Watch logs at most one line per
// change of state (up, or down in a condition), whatever the number of
// callers that report the same outage; it starts no goroutine.
package pglink

// Package pgdial dials PostgreSQL connections that notice a dead link.
//
// pgconn's own dialer probes an idle connection after five minutes (Go's
// default keepalive) and never gives up on unacknowledged data before the
// kernel's retransmissions run out, about a quarter of an hour: a source
// or target host that vanishes (a partition, a host powered off) leaves a
// query waiting on a reply that never comes for that long. Apply sets a
// dialer whose TCP keepalives probe after KeepAliveIdle of silence, every
// KeepAliveInterval, and give up after KeepAliveCount unanswered probes,
// and (Linux) a TCP_USER_TIMEOUT of UserTimeout on data sent and not
// acknowledged, so a dead host fails a connection in well under a minute.
// A live host answers probes whatever the server is doing, so a long
// query is never cut short by them.
//
// What a socket cannot tell (a server process that is stuck, a proxy
// that swallows the traffic) is for the caller's own liveness checks
// (pgsource's receive timeout).
//
// Invariants: Apply keeps the config's connect timeout and leaves Unix
// sockets as they are (keepalives are for TCP).
package pgdial

// Package pgdial dials PostgreSQL connections that notice a dead link.
//
// pgconn's own dialer probes an idle connection after five minutes (Go's
// default keepalive): a source or target host that vanishes (a partition,
// a host powered off) while a client waits for a reply leaves the query
// waiting for that long and more. Apply sets a dialer whose TCP keepalives
// probe after KeepAliveIdle of silence, every KeepAliveInterval, and give
// up after KeepAliveCount unanswered probes: a connection waiting on a
// dead host fails about KeepAliveIdle + KeepAliveCount*KeepAliveInterval
// (25 s) after the host's last word. A live host answers probes whatever
// the server is doing, so a long query or a lock wait is not cut short.
//
// No TCP_USER_TIMEOUT: since Linux 5.11 it also aborts a connection whose
// live peer keeps its receive window shut for that long, which a sink's
// lane sees when it has sent a pipeline larger than the socket buffers and
// a statement of it waits on a lock; and set, it replaces the keepalives'
// count. Data sent to a dead host is left to the kernel's retransmissions.
//
// What a socket cannot tell (a server process that is stuck, a proxy
// that swallows the traffic) is for the caller's own liveness checks
// (pgsource's receive timeout).
//
// Invariants: Apply keeps the config's connect timeout; keepalives are for
// TCP (a Unix socket dials as it did).
package pgdial

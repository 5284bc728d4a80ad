package pgsource

import (
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcflow/eventservice/pkg/clock"
)

// lingerConn is the replication connection's socket, which lets the
// kernel's receive queue fill for a moment after a read found it nearly
// empty, instead of reading again at once.
//
// Why: a walsender sends each pgoutput message as it decodes it, so a
// stream that keeps up with a live load reads about one message per
// read(2), and each read that finds the queue empty parks the stream's
// goroutine in the netpoller until the next message. In a profile of
// `serve` at 100 tables under make pgbench's load, the socket reads were a
// sixth of the process and the netpoller and the Go scheduler another
// eighth: per message, not per row. A read that follows a short one
// (fewer bytes than asked for: the queue was drained) first waits until
// linger has passed since that short read, so the stream reads every
// linger at most while it keeps up, and a stream that is behind (each
// read fills the buffer) never waits. It costs at most linger of latency
// per message, on a lag budget of a second; the walsender is not slowed
// (its socket buffer holds far more than a linger of a live load).
//
// The wait is real time whatever the source's Clock (clock.RealSleep): it
// is for the kernel, as a socket deadline is. It cannot delay a read past
// a deadline by more than linger, so the stream's ticks and its context's
// end still wake it.
type lingerConn struct {
	net.Conn
	linger time.Duration
	// streaming: the session has started replication; until then (the
	// start-up, a slot's creation, the idle wait of a snapshot) every read
	// is a reply the caller waits for, and none lingers.
	streaming bool
	// short times the last read that drained the queue; valid when
	// waiting is set.
	short   clock.Stopwatch
	waiting bool
	// start, since and sleep are the real clock (clock.StartStopwatch,
	// Stopwatch.Elapsed, clock.RealSleep); tests replace them.
	start func() clock.Stopwatch
	since func(clock.Stopwatch) time.Duration
	sleep func(time.Duration)
}

func newLingerConn(c net.Conn, linger time.Duration) *lingerConn {
	return &lingerConn{Conn: c, linger: linger, since: clock.Stopwatch.Elapsed, sleep: clock.RealSleep,
		start: clock.StartStopwatch}
}

// lingerOf returns conn's lingerConn, or nil (ReadLinger off).
func lingerOf(conn *pgconn.PgConn) *lingerConn {
	c, _ := conn.Conn().(*lingerConn)
	return c
}

// stream makes the reads linger from now on; it is called on the goroutine
// that reads, before it reads the stream.
func (c *lingerConn) stream() {
	if c != nil {
		c.streaming = true
	}
}

func (c *lingerConn) Read(p []byte) (int, error) {
	if c.waiting {
		c.waiting = false
		if wait := c.linger - c.since(c.short); wait > 0 {
			c.sleep(wait)
		}
	}
	n, err := c.Conn.Read(p)
	if c.streaming && n > 0 && n < len(p) {
		c.short, c.waiting = c.start(), true
	}
	return n, err
}

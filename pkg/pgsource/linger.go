package pgsource

import (
	"fmt"
	"net"
	"sync/atomic"
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
// goroutine in the netpoller until the next message: reads, netpoller and
// scheduler work per message, not per row (docs/benchmarks.md, "Figures
// behind the code"). A read that follows a short one
// (fewer bytes than asked for: the queue was drained) first waits until
// linger has passed since that short read, so the stream reads every
// linger at most while it keeps up, and a stream that is behind (each
// read fills the buffer) never waits. It costs at most linger of latency
// per message, on a lag budget of a second; the walsender is not slowed
// (its socket buffer holds far more than a linger of a live load).
//
// A linger is also bounded by what it lets pile up: at most lingerBytes at
// the rate the stream has been arriving (the bytes read since the last
// linger began, over the time since), so a stream that arrives fast, a
// walsender draining a backlog that this process reads as fast as it
// comes, waits a few milliseconds, not the whole linger: the socket's
// buffers (the receiver's 128 KiB and the sender's 16 KiB to start with on
// Linux, both growing) do not fill, and the walsender does not wait for
// this process to read, as it would for about a buffer per linger if the
// linger were unbounded.
//
// While a linger lasts the socket is hushed (hush, Linux: SO_RCVLOWAT
// raised to hushMark): the kernel wakes no reader until
// the linger ends. Without it, every message that arrives during a linger
// woke the netpoller for nothing (the stream's goroutine sleeps, it does
// not wait on the socket), which went back to sleep until the next one:
// a wake-up per message where the stream reads once per linger. The hush is
// set by the short read that starts a linger and lifted (SO_RCVLOWAT back
// to 1) before the read that ends it, so no read ever waits on a raised
// mark.
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
	// short is when the last read that drained the queue returned; valid
	// when waiting is set.
	short   time.Duration
	waiting bool
	// cycle is when the last linger began (valid when cycling is set),
	// cycleBytes what was read since.
	cycle      time.Duration
	cycling    bool
	cycleBytes int
	// now and sleep are real time: now the time since the connection was
	// made (a clock.Stopwatch), sleep clock.RealSleep; tests replace them.
	now   func() time.Duration
	sleep func(time.Duration)
	// hush raises (true) or lowers (false) the socket's receive low-water
	// mark; nil where the socket has none to set (see hushOf). hushed is
	// whether it is raised.
	hush   func(on bool) error
	hushed bool
	// got counts the bytes read: the stream's liveness hears the server
	// by them, so a message that takes long to arrive (a large value over
	// a slow link) is not taken for silence. Atomic: pgconn may read on a
	// goroutine of its own while it writes.
	got atomic.Int64
}

func newLingerConn(c net.Conn, linger time.Duration) *lingerConn {
	made := clock.StartStopwatch()
	l := &lingerConn{Conn: c, linger: linger, now: made.Elapsed, sleep: clock.RealSleep}
	if linger > 0 {
		l.hush = hushOf(c)
	}
	return l
}

// lingerKey keeps a replication connection's lingerConn in its
// CustomData.
const lingerKey = "cdcflow.linger"

// lingerOf returns conn's lingerConn (one that never lingers when
// ReadLinger is off), nil for a connection connectReplication did not
// make. It is kept
// with the connection (connectReplication): conn.Conn() is the TLS layer
// above it when TLS was negotiated, as pgx's default sslmode (prefer)
// does with a server that has ssl on, and found by a type assertion there
// the linger was silently off.
func lingerOf(conn *pgconn.PgConn) *lingerConn {
	c, _ := conn.CustomData()[lingerKey].(*lingerConn)
	return c
}

// stream makes the reads linger from now on; it is called on the goroutine
// that reads, before it reads the stream.
func (c *lingerConn) stream() {
	if c != nil {
		c.streaming = true
	}
}

// lingerBytes bounds what a linger lets arrive, at the stream's rate.
const lingerBytes = 128 << 10

func (c *lingerConn) Read(p []byte) (int, error) {
	if c.waiting {
		c.waiting = false
		now := c.now()
		if wait := c.wait(now) - (now - c.short); wait > 0 {
			c.sleep(wait)
		}
		c.cycle, c.cycling, c.cycleBytes = now, true, 0
	}
	if err := c.setHush(false); err != nil {
		return 0, err // a read with the mark raised could wait with data queued
	}
	n, err := c.Conn.Read(p)
	c.cycleBytes += n
	c.got.Add(int64(n))
	if c.streaming && c.linger > 0 && n > 0 && n < len(p) {
		c.short, c.waiting = c.now(), true
		_ = c.setHush(true) // refused: lingers unhushed
	}
	return n, err
}

// setHush raises or lowers the socket's low-water mark, if it has one and
// it is not already so. A socket that refuses to raise it is not hushed
// again: the linger works without it, at the cost of the wake-ups it
// saves. One that refuses to lower it fails the read (the connection is
// broken: setsockopt on a live TCP socket does not fail).
func (c *lingerConn) setHush(on bool) error {
	if c.hush == nil || c.hushed == on {
		return nil
	}
	if err := c.hush(on); err != nil {
		if c.hushed {
			return fmt.Errorf("pgsource: lower the replication socket's SO_RCVLOWAT: %w", err)
		}
		c.hush = nil
		return nil
	}
	c.hushed = on
	return nil
}

// wait is how long the linger beginning now lasts from its short read:
// linger, or less if at the stream's rate since the last linger began more
// than lingerBytes would arrive in it.
func (c *lingerConn) wait(now time.Duration) time.Duration {
	if !c.cycling || c.cycleBytes == 0 {
		return c.linger
	}
	// The time lingerBytes take at cycleBytes per (now - cycle).
	return min(c.linger, time.Duration(float64(now-c.cycle)*lingerBytes/float64(c.cycleBytes)))
}

package remote

import (
	"time"

	"go.uber.org/zap"
)

// Connections whose handshake has not completed. A TCP connection that
// never starts its TLS handshake costs the server a connection slot and a
// goroutine; 256 of them (from four addresses, at the per-address bound)
// used to fill MaxConnections and keep every collector out for as long as
// they were held. So a connection is "in its handshake" from its accept
// until gRPC has completed the TLS handshake and read the HTTP/2 preface
// and settings (gRPC clears the deadline it set on the raw connection at
// accept: trackedConn.SetDeadline sees that), and such connections are
// bounded three ways:
//
//   - in time: HandshakeTimeout after its accept, on the server's clock, a
//     connection still in its handshake is closed. The timer starts at
//     the accept, before the TLS handshake does. (gRPC's ConnectionTimeout,
//     set to the same value, is the same deadline on the socket, on the
//     real clock: both apply.)
//   - per address: MaxHandshakesPerIP; one more from that address is
//     closed on accept.
//   - in all: MaxHandshakes (below MaxConnections, so the rest of the
//     slots are reached only through a completed handshake: with TLS, by a
//     certificate the Policy knows). One more, from an address holding
//     fewer than the address holding the most, takes the place of that
//     address's oldest (closed); from any other it is closed on accept. So
//     a collector from an address of its own always gets its handshake
//     started, and keeps it while MaxHandshakes newer connections arrive.

// admitLocked decides on a connection just accepted: admitted (and then
// tracked, in its handshake), and a connection in its handshake to close
// in its place, if any. REQUIRES: t.mu held.
func (t *connTracker) admitLocked(c *trackedConn) (admitted bool, evicted *trackedConn) {
	lim := t.limits
	if t.mu.closed || len(t.mu.conns) >= lim.max || t.mu.perIP[c.ip] >= lim.maxPerIP || len(t.mu.pending[c.ip]) >= lim.maxHandshakesIP {
		return false, nil
	}
	if t.mu.nPending >= lim.maxHandshakes {
		// The address holding the most, the oldest of them on a tie.
		var most []*trackedConn
		for _, cs := range t.mu.pending {
			if len(cs) > len(most) || (len(cs) == len(most) && cs[0].accepted.Before(most[0].accepted)) {
				most = cs
			}
		}
		if len(most) <= len(t.mu.pending[c.ip]) {
			return false, nil
		}
		evicted = most[0]
		t.settleLocked(evicted) // its slot is the newcomer's now; Close follows
	}
	c.accepted = t.clk.Now()
	c.timer = t.clk.NewTimer(lim.handshakeTimeout)
	t.mu.conns[c.key] = c
	t.mu.perIP[c.ip]++
	t.mu.pending[c.ip] = append(t.mu.pending[c.ip], c)
	t.mu.nPending++
	return true, evicted
}

// settleLocked ends c's handshake: completed, closed or evicted. It
// reports whether c was in its handshake. REQUIRES: t.mu held.
func (t *connTracker) settleLocked(c *trackedConn) bool {
	cs := t.mu.pending[c.ip]
	for i, x := range cs {
		if x != c {
			continue
		}
		copy(cs[i:], cs[i+1:])
		cs[len(cs)-1] = nil
		if cs = cs[:len(cs)-1]; len(cs) == 0 {
			delete(t.mu.pending, c.ip)
		} else {
			t.mu.pending[c.ip] = cs
		}
		t.mu.nPending--
		// Stopped here, not by its watch: a test's fake clock must not see
		// the deadline of a handshake that completed as a timer waiting.
		c.timer.Stop()
		close(c.settled)
		return true
	}
	return false
}

// watchHandshake closes c if its handshake has not completed when its
// deadline passes. One goroutine per connection in its handshake (at most
// MaxHandshakes), ended by the handshake, the connection's close, or the
// tracker's.
func (t *connTracker) watchHandshake(c *trackedConn) {
	t.wg.Go(func() {
		select {
		case <-c.settled:
		case <-t.stop:
		case <-c.timer.C():
			t.mu.Lock()
			late := t.settleLocked(c)
			t.mu.Unlock()
			if late {
				t.refused()
				t.log.Info("connection closed: no handshake within HandshakeTimeout", zap.String("from", c.key),
					zap.Duration("handshake_timeout", t.limits.handshakeTimeout))
				_ = c.Close()
			}
		}
	})
}

// handshakes is the number of connections in their handshake.
func (t *connTracker) handshakes() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.mu.nPending
}

// SetDeadline passes d to the connection. gRPC sets a deadline on a raw
// connection when it accepts it and clears it once the TLS and HTTP/2
// handshakes are done (Server.handleRawConn): the clearing is the end of
// the handshake (TestIdleConnectionsBeforeTheHandshakeDoNotKeepACollectorOut
// checks that a collector's connection leaves the count).
func (c *trackedConn) SetDeadline(d time.Time) error {
	if d.IsZero() {
		c.t.mu.Lock()
		c.t.settleLocked(c)
		c.t.mu.Unlock()
	}
	return c.Conn.SetDeadline(d)
}

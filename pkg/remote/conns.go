package remote

import (
	"net"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/clock"
)

// connTracker is the server's view of its TCP connections, below gRPC: it
// bounds how many are open at once (a connection beyond MaxConnections is
// closed as soon as it is accepted, so a flood of dials costs an accept
// each, not a TLS handshake and an HTTP/2 transport each) and can close
// the connection a stream runs on when the stream is declared dead.
// Closing the socket is what releases a writer blocked in SendMsg on a
// link that no longer answers: gRPC then fails the transport and cancels
// its streams, whatever the peer does.
//
// It also bounds connections whose handshake (TLS, then HTTP/2's preface
// and settings) has not completed (handshake.go): per address, in all,
// and in time.
type connTracker struct {
	limits connLimits
	log    *zap.Logger
	clk    clock.Clock
	// refused counts a connection closed on accept or before its
	// handshake completed.
	refused func()
	stop    chan struct{} // closed by close: handshake watches end
	wg      sync.WaitGroup

	mu struct {
		sync.Mutex
		conns    map[string]*trackedConn // by remote address
		perIP    map[string]int
		pending  map[string][]*trackedConn // handshakes under way, by IP, oldest first
		nPending int
		lastWarn time.Time
		unwarned int // refusals since the last warning
		closed   bool
	}
}

// connLimits are a connTracker's bounds (ServerOptions).
type connLimits struct {
	max, maxPerIP                  int
	maxHandshakes, maxHandshakesIP int
	handshakeTimeout               time.Duration
}

func newConnTracker(limits connLimits, log *zap.Logger, clk clock.Clock, refused func()) *connTracker {
	t := &connTracker{limits: limits, log: log, clk: clk, refused: refused, stop: make(chan struct{})}
	t.mu.conns = map[string]*trackedConn{}
	t.mu.perIP = map[string]int{}
	t.mu.pending = map[string][]*trackedConn{}
	return t
}

// ipOf is the host part of a remote address.
func ipOf(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return host
}

// listener wraps lis so that every connection it accepts is tracked.
func (t *connTracker) listener(lis net.Listener) net.Listener {
	return &trackedListener{Listener: lis, t: t}
}

// count is the number of open connections.
func (t *connTracker) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.mu.conns)
}

// kill closes the connection from remote, if it is still open.
func (t *connTracker) kill(remote string) bool {
	t.mu.Lock()
	c := t.mu.conns[remote]
	t.mu.Unlock()
	if c == nil {
		return false
	}
	_ = c.Close()
	return true
}

// close ends the handshake watches and closes the connections still in
// their handshake (gRPC's Stop would wait for their handshakes to end).
func (t *connTracker) close() {
	t.mu.Lock()
	if t.mu.closed {
		t.mu.Unlock()
		return
	}
	t.mu.closed = true
	close(t.stop)
	var pending []*trackedConn
	for _, cs := range t.mu.pending {
		pending = append(pending, cs...)
	}
	t.mu.Unlock()
	for _, c := range pending {
		_ = c.Close()
	}
	t.wg.Wait()
}

type trackedListener struct {
	net.Listener
	t *connTracker
}

func (l *trackedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		tc := &trackedConn{Conn: c, t: l.t, key: c.RemoteAddr().String(), settled: make(chan struct{})}
		tc.ip = ipOf(tc.key)
		l.t.mu.Lock()
		admitted, evicted := l.t.admitLocked(tc)
		if admitted {
			// Under the lock, so that close's Wait follows the Add.
			l.t.watchHandshake(tc)
		}
		warn := false
		if !admitted {
			// At most one warning a second: a flood must not flood the log.
			l.t.mu.unwarned++
			if now := l.t.clk.Now(); now.Sub(l.t.mu.lastWarn) >= time.Second {
				warn, l.t.mu.lastWarn = true, now
			}
		}
		n := l.t.mu.unwarned
		if warn {
			l.t.mu.unwarned = 0
		}
		l.t.mu.Unlock()
		if evicted != nil {
			l.t.refused()
			_ = evicted.Close()
		}
		if admitted {
			return tc, nil
		}
		l.t.refused()
		if warn {
			l.t.log.Warn("connections refused: MaxConnections or MaxConnectionsPerIP open, or MaxHandshakesPerIP under way",
				zap.String("last_from", tc.key), zap.Int("refused", n), zap.Int("max", l.t.limits.max),
				zap.Int("max_per_ip", l.t.limits.maxPerIP), zap.Int("max_handshakes_per_ip", l.t.limits.maxHandshakesIP))
		}
		_ = c.Close()
	}
}

type trackedConn struct {
	net.Conn
	t       *connTracker
	key, ip string
	once    sync.Once
	// settled is closed when the handshake completed or the connection
	// closed, whichever is first (under t.mu).
	settled  chan struct{}
	accepted time.Time   // on the server's clock
	timer    clock.Timer // the handshake deadline, on the server's clock
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.t.mu.Lock()
		if c.t.mu.conns[c.key] == c {
			c.t.settleLocked(c)
			delete(c.t.mu.conns, c.key)
			if c.t.mu.perIP[c.ip]--; c.t.mu.perIP[c.ip] <= 0 {
				delete(c.t.mu.perIP, c.ip)
			}
		}
		c.t.mu.Unlock()
	})
	return err
}

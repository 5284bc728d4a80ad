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
type connTracker struct {
	max, maxPerIP int
	log           *zap.Logger
	clk           clock.Clock
	refused       func()

	mu struct {
		sync.Mutex
		conns    map[string]*trackedConn // by remote address
		perIP    map[string]int
		lastWarn time.Time
		unwarned int // refusals since the last warning
	}
}

func newConnTracker(maxConns, maxPerIP int, log *zap.Logger, clk clock.Clock, refused func()) *connTracker {
	t := &connTracker{max: maxConns, maxPerIP: maxPerIP, log: log, clk: clk, refused: refused}
	t.mu.conns = map[string]*trackedConn{}
	t.mu.perIP = map[string]int{}
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
		tc := &trackedConn{Conn: c, t: l.t, key: c.RemoteAddr().String()}
		ip := ipOf(tc.key)
		l.t.mu.Lock()
		full := len(l.t.mu.conns) >= l.t.max || l.t.mu.perIP[ip] >= l.t.maxPerIP
		if !full {
			l.t.mu.conns[tc.key] = tc
			l.t.mu.perIP[ip]++
		}
		warn := false
		if full {
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
		if !full {
			return tc, nil
		}
		l.t.refused()
		if warn {
			l.t.log.Warn("connections refused: MaxConnections or MaxConnectionsPerIP open", zap.String("last_from", tc.key),
				zap.Int("refused", n), zap.Int("max", l.t.max), zap.Int("max_per_ip", l.t.maxPerIP))
		}
		_ = c.Close()
	}
}

type trackedConn struct {
	net.Conn
	t    *connTracker
	key  string
	once sync.Once
}

func (c *trackedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.t.mu.Lock()
		if c.t.mu.conns[c.key] == c {
			delete(c.t.mu.conns, c.key)
			ip := ipOf(c.key)
			if c.t.mu.perIP[ip]--; c.t.mu.perIP[ip] <= 0 {
				delete(c.t.mu.perIP, ip)
			}
		}
		c.t.mu.Unlock()
	})
	return err
}

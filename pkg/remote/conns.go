package remote

import (
	"net"
	"sync"

	"go.uber.org/zap"
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
	max     int
	log     *zap.Logger
	refused func()

	mu struct {
		sync.Mutex
		conns map[string]*trackedConn // by remote address
	}
}

func newConnTracker(maxConns int, log *zap.Logger, refused func()) *connTracker {
	t := &connTracker{max: maxConns, log: log, refused: refused}
	t.mu.conns = map[string]*trackedConn{}
	return t
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
		l.t.mu.Lock()
		full := len(l.t.mu.conns) >= l.t.max
		if !full {
			l.t.mu.conns[tc.key] = tc
		}
		l.t.mu.Unlock()
		if !full {
			return tc, nil
		}
		l.t.refused()
		l.t.log.Warn("connection refused: MaxConnections open", zap.String("from", tc.key), zap.Int("max", l.t.max))
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
		}
		c.t.mu.Unlock()
	})
	return err
}

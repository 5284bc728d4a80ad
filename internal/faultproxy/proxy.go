package pgtest

import (
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a loopback TCP proxy in front of a server, for fault tests: it
// can delay every chunk it forwards (a slow link: half of a round trip each
// way), hold what clients send (Hold: a statement caught on the wire, for
// a test to act at exactly that moment) and reset every connection through
// it at once (a network fault).
type Proxy struct {
	// Addr is the proxy's 127.0.0.1:port.
	Addr   string
	ln     net.Listener
	target string
	delay  time.Duration
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	hold  *hold // nil: forwarding
}

// hold is one Hold: arrived closes when the first chunk is caught, release
// when the hold ends (Release or Reset).
type hold struct {
	arrived, release chan struct{}
	once             sync.Once
}

// StartProxy forwards Addr to target with delay added to each direction
// (delay 0: none). The test's cleanup closes it and every connection.
func StartProxy(t testing.TB, target string, delay time.Duration) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("pgtest: proxy: %v", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), ln: ln, target: target, delay: delay, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		p.Reset()
		p.wg.Wait()
	})
	return p
}

// Hold stops forwarding what clients send to the server: each chunk waits
// (the client's write has succeeded; the server has not seen it) until
// Release forwards it or Reset drops it. The returned channel is closed
// when the first chunk is caught, so a test knows a request is on the wire.
func (p *Proxy) Hold() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hold == nil {
		p.hold = &hold{arrived: make(chan struct{}), release: make(chan struct{})}
	}
	return p.hold.arrived
}

// Release ends a Hold: caught chunks go on to the server.
func (p *Proxy) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.releaseLocked()
}

func (p *Proxy) releaseLocked() {
	if p.hold != nil {
		close(p.hold.release)
		p.hold = nil
	}
}

// Reset closes every connection through the proxy (with TCP RST where the
// platform allows), as a network fault would, and ends a Hold, dropping
// what it caught; new connections still work.
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	defer p.releaseLocked() // after the close: a caught chunk then finds its connection gone
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
	}
	clear(p.conns)
}

func (p *Proxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		p.conns[client], p.conns[server] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(server, client, true) })
		p.wg.Go(func() { p.pipe(client, server, false) })
	}
}

// pipe copies src to dst, holding each chunk for the delay (and, from a
// client, while a Hold lasts), until either side closes; then it closes
// both.
func (p *Proxy) pipe(dst, src net.Conn, fromClient bool) {
	defer func() {
		_ = dst.Close()
		_ = src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if p.delay > 0 {
				time.Sleep(p.delay) // the simulated link's latency, not synchronisation
			}
			if fromClient {
				p.waitHold()
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil { // EOF or a reset: either way the pair is done
			return
		}
	}
}

// waitHold blocks while a Hold lasts, telling the holder a chunk arrived.
func (p *Proxy) waitHold() {
	p.mu.Lock()
	h := p.hold
	p.mu.Unlock()
	if h == nil {
		return
	}
	h.once.Do(func() { close(h.arrived) })
	<-h.release
}

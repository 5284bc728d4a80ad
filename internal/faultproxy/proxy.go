package faultproxy

import (
	"net"
	"sync"
	"testing"
	"time"
)

// Direction is a direction of the proxied connections.
type Direction int

const (
	// Upstream is what clients send to the target.
	Upstream Direction = iota
	// Downstream is what the target sends to clients.
	Downstream
)

// Proxy forwards Addr to a target. Create with Start.
type Proxy struct {
	// Addr is the proxy's 127.0.0.1:port.
	Addr   string
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu          sync.Mutex
	delay       time.Duration
	conns       map[net.Conn]struct{}
	holds       [2]*hold // per direction; nil: forwarding
	partitioned bool
}

// hold is one Hold: arrived closes when the first chunk is caught, release
// when the hold ends (Release, Reset or Partition).
type hold struct {
	arrived, release chan struct{}
	once             sync.Once
}

// Start forwards a new loopback address to target. The test's cleanup
// closes it and every connection.
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("faultproxy: %v", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		p.Reset()
		p.wg.Wait()
	})
	return p
}

// SetDelay adds d to every chunk forwarded in either direction (half of a
// round trip each way); 0 removes it.
func (p *Proxy) SetDelay(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay = d
}

// Hold stops forwarding in direction dir: each chunk read waits (the
// sender's write succeeded; the receiver has not seen it, and the proxy
// reads nothing more from that side, so the sender's buffers fill as if
// its peer had stopped reading) until Release forwards it or Reset drops
// it. The returned channel is closed when the first chunk is caught.
func (p *Proxy) Hold(dir Direction) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.holds[dir] == nil {
		p.holds[dir] = &hold{arrived: make(chan struct{}), release: make(chan struct{})}
	}
	return p.holds[dir].arrived
}

// Release ends the holds of both directions: caught chunks go on.
func (p *Proxy) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.releaseLocked()
}

func (p *Proxy) releaseLocked() {
	for i, h := range p.holds {
		if h != nil {
			close(h.release)
			p.holds[i] = nil
		}
	}
}

// Reset closes every connection through the proxy (with TCP RST where the
// platform allows), as a network fault would, and ends the holds,
// dropping what they caught; new connections still work.
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resetLocked()
}

func (p *Proxy) resetLocked() {
	defer p.releaseLocked() // after the close: a caught chunk then finds its connection gone
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
	}
	clear(p.conns)
}

// Partition resets every connection and refuses new ones (accepted, then
// closed at once) until Heal.
func (p *Proxy) Partition() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.partitioned = true
	p.resetLocked()
}

// Heal ends a Partition.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.partitioned = false
}

func (p *Proxy) accept() {
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		partitioned := p.partitioned
		p.mu.Unlock()
		if partitioned {
			_ = client.Close()
			continue
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		if p.partitioned { // partitioned while dialling
			p.mu.Unlock()
			_ = client.Close()
			_ = server.Close()
			continue
		}
		p.conns[client], p.conns[server] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(server, client, Upstream) })
		p.wg.Go(func() { p.pipe(client, server, Downstream) })
	}
}

// pipe copies src to dst, holding each chunk for the delay and while a
// hold of its direction lasts, until either side closes; then it closes
// both.
func (p *Proxy) pipe(dst, src net.Conn, dir Direction) {
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
			p.mu.Lock()
			delay := p.delay
			p.mu.Unlock()
			if delay > 0 {
				time.Sleep(delay) // the simulated link's latency, not synchronisation
			}
			p.waitHold(dir)
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil { // EOF or a reset: either way the pair is done
			return
		}
	}
}

// waitHold blocks while a hold of dir lasts, telling the holder a chunk
// arrived.
func (p *Proxy) waitHold(dir Direction) {
	p.mu.Lock()
	h := p.holds[dir]
	p.mu.Unlock()
	if h == nil {
		return
	}
	h.once.Do(func() { close(h.arrived) })
	<-h.release
}

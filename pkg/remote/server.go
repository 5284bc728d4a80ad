package remote

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/cdcflow/eventservice/pkg/messaging"
)

// MaxFrameBytes is the largest gRPC message either side accepts. A data
// frame is one Send call: the event service bounds its DML batches far
// below this.
const MaxFrameBytes = 64 << 20

// ServerOptions configure a Server.
type ServerOptions struct {
	// Logger defaults to zap.NewNop().
	Logger *zap.Logger
	// TLS, if set, serves TLS with it (set ClientAuth and ClientCAs for
	// mutual TLS); nil serves plaintext.
	TLS *tls.Config
	// Registerer, if set, receives the server's metrics (cdcflow_remote_server_*).
	Registerer prometheus.Registerer
}

// Server is the event service's end: a messaging.Transport (and
// RoomNotifier) whose targets are collectors connected over gRPC, and the
// server of the service's control plane. Create with NewServer, Start
// with a listener and the control plane, Close to stop.
type Server struct {
	log  *zap.Logger
	grpc *grpc.Server
	cp   messaging.ControlPlane
	wg   sync.WaitGroup
	met  *serverMetrics

	mu struct {
		sync.Mutex
		peers  map[messaging.Target]*peer
		closed bool
	}
}

// NewServer builds a server. It starts nothing. The only error is the
// Registerer's, when the metrics cannot be registered.
func NewServer(opts ServerOptions) (*Server, error) {
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	s := &Server{log: opts.Logger.Named("remote")}
	s.mu.peers = map[messaging.Target]*peer{}
	s.met = newServerMetrics(s)
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(s.met); err != nil {
			return nil, fmt.Errorf("remote: register metrics: %w", err)
		}
	}
	sopts := []grpc.ServerOption{grpc.ForceServerCodec(rawCodec{}), grpc.MaxRecvMsgSize(MaxFrameBytes),
		grpc.MaxSendMsgSize(MaxFrameBytes), grpc.WaitForHandlers(true)}
	if opts.TLS != nil {
		sopts = append(sopts, grpc.Creds(credentials.NewTLS(opts.TLS)))
	}
	s.grpc = grpc.NewServer(sopts...)
	s.grpc.RegisterService(serviceDesc(), s)
	return s, nil
}

// peers returns the current peers.
func (s *Server) peers() []*peer {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*peer, 0, len(s.mu.peers))
	for _, p := range s.mu.peers {
		out = append(out, p)
	}
	return out
}

// Start serves lis, answering control calls with cp, until Close.
func (s *Server) Start(lis net.Listener, cp messaging.ControlPlane) error {
	if cp == nil {
		return fmt.Errorf("%w: nil control plane", messaging.ErrInvalidOptions)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return messaging.ErrClosed
	}
	s.cp = cp
	s.wg.Go(func() {
		if err := s.grpc.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.log.Warn("serve ended", zap.Error(err))
		}
	})
	return nil
}

// Close stops serving: streams end, collectors see their connection
// drop, later Sends fail with ErrClosed. It waits for every goroutine the
// server started.
func (s *Server) Close() {
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return
	}
	s.mu.closed = true
	s.mu.Unlock()
	s.grpc.Stop()
	s.wg.Wait()
}

// Connected is the number of collectors whose data stream is open.
func (s *Server) Connected() int {
	n := 0
	for _, p := range s.peers() {
		p.mu.Lock()
		if p.mu.broken == nil {
			n++
		}
		p.mu.Unlock()
	}
	return n
}

func (s *Server) control(ctx context.Context, req []byte) []byte {
	return serveControl(ctx, s.cp, req)
}

// peer is one collector's stream as the sender sees it.
type peer struct {
	target   messaging.Target
	capacity int // the credit the collector opened with: its inbox's capacity
	wake     chan struct{}
	counters peerCounters // the target's series, looked up once per stream

	mu struct {
		sync.Mutex
		credit int
		queue  [][]byte // encoded frames not yet written to the stream
		broken error    // set once the stream ended
		room   chan struct{}
	}
}

// Send implements messaging.Transport: it encodes msgs as one frame and
// queues it for target's stream if target's collector has granted credit
// for all of them; it never waits for the network.
func (s *Server) Send(target messaging.Target, msgs []messaging.Message) error {
	for _, m := range msgs {
		if err := messaging.Validate(m); err != nil {
			return err
		}
	}
	s.mu.Lock()
	p, closed := s.mu.peers[target], s.mu.closed
	s.mu.Unlock()
	switch {
	case closed:
		return messaging.ErrClosed
	case p == nil:
		s.met.refused.WithLabelValues(string(target), "unavailable").Inc()
		return fmt.Errorf("%w: %q has not connected", messaging.ErrUnknownTarget, target)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.mu.broken != nil:
		p.counters.unavailable.Inc()
		return fmt.Errorf("%w: %w: %q: %v", messaging.ErrSendFailed, messaging.ErrUnavailable, target, p.mu.broken)
	case len(msgs) > p.capacity:
		p.counters.tooLarge.Inc()
		return fmt.Errorf("%w: %d messages, %q takes %d", messaging.ErrBatchTooLarge, len(msgs), target, p.capacity)
	case len(msgs) > p.mu.credit:
		p.counters.busy.Inc()
		return messaging.ErrBusy
	case len(msgs) == 0:
		return nil
	}
	p.counters.sent.Add(float64(len(msgs)))
	p.mu.credit -= len(msgs)
	p.mu.queue = append(p.mu.queue, appendMessages(nil, msgs))
	select {
	case p.wake <- struct{}{}:
	default:
	}
	return nil
}

// Room implements messaging.RoomNotifier: the channel is closed once
// target's collector has granted back half its capacity, or at once if it
// has that much already or its stream is gone.
func (s *Server) Room(target messaging.Target) <-chan struct{} {
	s.mu.Lock()
	p := s.mu.peers[target]
	s.mu.Unlock()
	if p == nil {
		return closedChan()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mu.broken != nil || 2*p.mu.credit >= p.capacity {
		return closedChan()
	}
	if p.mu.room == nil {
		p.mu.room = make(chan struct{})
	}
	return p.mu.room
}

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

func (p *peer) grant(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mu.credit = min(p.mu.credit+n, p.capacity) // a confused peer cannot inflate it
	if p.mu.room != nil && 2*p.mu.credit >= p.capacity {
		close(p.mu.room)
		p.mu.room = nil
	}
}

func (p *peer) fail(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mu.broken == nil {
		p.mu.broken = err
		p.mu.queue = nil
	}
	if p.mu.room != nil {
		close(p.mu.room) // a waiting sender learns from its next Send
		p.mu.room = nil
	}
}

// take returns the queued frames, or the stream's error.
func (p *peer) take(dst [][]byte) ([][]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mu.broken != nil {
		return dst, p.mu.broken
	}
	dst = append(dst, p.mu.queue...)
	clear(p.mu.queue)
	p.mu.queue = p.mu.queue[:0]
	return dst, nil
}

// errStreamReplaced ends a collector's old stream when it connects anew.
var errStreamReplaced = errors.New("remote: the collector connected again")

// data serves one collector's stream: a hello naming its target and
// granting credit, then credit grants up; frames down.
func (s *Server) data(stream grpc.ServerStream) error {
	var f frame
	if err := stream.RecvMsg(&f); err != nil {
		return err
	}
	hello, err := decodeUp(f.b)
	if err != nil || hello.kind != frameHello || hello.target == "" || hello.capacity == 0 || hello.credit > hello.capacity {
		return fmt.Errorf("%w: a stream must open with a hello naming a target, a capacity and credit within it", ErrMalformed)
	}
	target, credit := hello.target, hello.credit
	p := &peer{target: target, capacity: int(hello.capacity), wake: make(chan struct{}, 1), counters: s.met.forTarget(string(target))}
	p.mu.credit = int(credit)
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return messaging.ErrClosed
	}
	old := s.mu.peers[target]
	s.mu.peers[target] = p
	s.mu.Unlock()
	if old != nil {
		old.fail(errStreamReplaced)
		select {
		case old.wake <- struct{}{}:
		default:
		}
	}
	s.met.streams.WithLabelValues(string(target)).Inc()
	s.log.Info("collector connected", zap.String("target", string(target)), zap.Int("credit", int(credit)))

	ctx := stream.Context()
	// The receiver ends when the stream does, which is after this handler
	// returns; Close waits for it (grpc.WaitForHandlers makes Stop wait
	// for this handler, so the Go happens before Close's Wait).
	s.wg.Go(func() {
		for {
			var up frame
			if err := stream.RecvMsg(&up); err != nil {
				p.fail(err)
				break
			}
			g, err := decodeUp(up.b)
			if err != nil || g.kind != frameCredit {
				p.fail(fmt.Errorf("%w: expected a credit frame", ErrMalformed))
				break
			}
			p.grant(int(g.credit))
		}
		select {
		case p.wake <- struct{}{}:
		default:
		}
	})
	var frames [][]byte
	for {
		select {
		case <-ctx.Done():
			p.fail(ctx.Err())
			return ctx.Err()
		case <-p.wake:
		}
		frames, err = p.take(frames[:0])
		if err != nil {
			s.log.Info("collector stream ended", zap.String("target", string(target)), zap.Error(err))
			return err
		}
		for _, b := range frames {
			if err := stream.SendMsg(&frame{b: b}); err != nil {
				p.fail(err)
				return err
			}
		}
	}
}

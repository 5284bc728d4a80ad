package remote

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/cdcflow/eventservice/internal/optcheck"
	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// MaxFrameBytes is the largest data frame the service sends and a
// collector accepts. A data frame is one Send call: the event service
// bounds its DML batches far below this. What the service receives is
// bounded far lower (maxUpFrameBytes).
const MaxFrameBytes = 64 << 20

// Defaults of ServerOptions and ClientOptions.
const (
	DefaultMaxTargets     = 1024
	DefaultMaxCapacity    = 1 << 16
	DefaultMaxConnections = 256
	// DefaultMaxConnectionsPerIP: one host cannot take every connection.
	DefaultMaxConnectionsPerIP = 64
	// DefaultLivenessTimeout: a data stream on which nothing arrived for
	// this long, or whose send has been blocked this long, is declared
	// dead. Each side pings every third of it when it has nothing else to
	// send, so a live but idle link never trips it.
	DefaultLivenessTimeout = 6 * time.Second
	// maxStreamsPerConnection bounds concurrent gRPC streams on one
	// connection: a collector has one data stream and a few control
	// calls in flight.
	maxStreamsPerConnection = 64
	// DefaultHandshakeTimeout bounds a connection's TLS and HTTP/2
	// handshake, from its accept (handshake.go).
	DefaultHandshakeTimeout = 10 * time.Second
	// DefaultMaxHandshakes and DefaultMaxHandshakesPerIP bound the
	// connections in their handshake, in all and per address: a collector
	// completes its handshake in a round trip or two, so a few per address
	// suffice, and connections that send nothing cannot take the slots
	// that completed handshakes need (handshake.go).
	DefaultMaxHandshakes      = 64
	DefaultMaxHandshakesPerIP = 8
	// DefaultControlReceiveTimeout bounds how long a Control request may
	// take to arrive whole: the largest (about 417 KiB) at 1 Mbit/s.
	DefaultControlReceiveTimeout = 5 * time.Second
	// DefaultMaxControlBytesPerConnection and DefaultMaxControlBytesPerIP
	// bound what a connection's and an address's Control calls may hold
	// while their requests arrive (control_budget.go): nine calls of the
	// largest request at once per connection, 78 per address.
	DefaultMaxControlBytesPerConnection = 4 << 20
	DefaultMaxControlBytesPerIP         = 32 << 20
)

// ServerOptions configure a Server. Zero fields take the documented
// defaults; NewServer reports every invalid field at once.
type ServerOptions struct {
	// Logger defaults to zap.NewNop().
	Logger *zap.Logger
	// TLS, if set, serves TLS with it; nil serves plaintext. With a
	// Policy it must verify client certificates (ClientAuth
	// tls.RequireAndVerifyClientCert); GetConfigForClient may supply the
	// certificates per handshake (reloading them, say).
	TLS *tls.Config
	// Policy says which targets each certificate identity may serve.
	// Required with TLS (state AnyTarget explicitly for a trust-every-
	// certificate setup); refused without it, since a plaintext peer has
	// no identity.
	Policy Policy
	// AllowInsecureListen lets Start serve plaintext on a listener that is
	// not loopback. Without TLS any process that reaches the port can
	// register dispatchers and read their rows, so the default refuses it.
	AllowInsecureListen bool
	// Registerer, if set, receives the server's metrics (cdcflow_remote_server_*).
	Registerer prometheus.Registerer
	// Clock drives the liveness checks. Default the real clock.
	Clock clock.Clock
	// MaxTargets bounds the targets the server keeps a stream (or a
	// broken stream's state) for; a hello for one more, when no broken
	// one can be dropped, is refused (ResourceExhausted). Default 1024.
	MaxTargets int
	// MaxCapacity caps the capacity (and so the credit) a collector may
	// announce: the messages the server queues for one target. A hello
	// announcing more is served with this much. Default 65536.
	MaxCapacity int
	// MaxConnections bounds open TCP connections, and MaxConnectionsPerIP
	// those from one address; more are closed on accept. A collector
	// process opens one per changefeed it serves. Defaults 256 and 64.
	MaxConnections, MaxConnectionsPerIP int
	// HandshakeTimeout: a connection whose TLS and HTTP/2 handshake has not
	// completed this long after its accept is closed. Default
	// DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// MaxHandshakes and MaxHandshakesPerIP bound the connections in their
	// handshake, in all and from one address. One more from an address is
	// closed on accept; one more in all takes the place of the oldest of
	// the address holding the most, if that is more than its own address
	// holds, and is closed on accept otherwise. MaxHandshakes is at most
	// MaxConnections. Defaults 64 and 8 (MaxHandshakes at most
	// MaxConnections/2 when MaxConnections is set lower).
	MaxHandshakes, MaxHandshakesPerIP int
	// ControlReceiveTimeout: a Control call whose request has not arrived
	// whole this long after the call began ends (DeadlineExceeded), and
	// what it held is released. Default DefaultControlReceiveTimeout.
	ControlReceiveTimeout time.Duration
	// MaxControlBytesPerConnection and MaxControlBytesPerIP bound the bytes
	// the Control calls of one connection, and of one remote address, may
	// hold while their requests arrive: each call is charged 64 KiB (what
	// gRPC may buffer of it unread) and, while its request is read, the
	// largest request (about 417 KiB). A call that cannot get the first is
	// refused (ResourceExhausted); one that cannot get the second waits,
	// until ControlReceiveTimeout. Defaults 4 MiB and 32 MiB;
	// MaxControlBytesPerConnection must hold one largest request, and
	// MaxControlBytesPerIP one connection's budget.
	MaxControlBytesPerConnection, MaxControlBytesPerIP int64
	// LivenessTimeout: a stream on which nothing arrived for this long, or
	// whose send has been blocked this long, is declared dead: Sends to
	// its target fail with ErrUnavailable at once, its frames are
	// released and its connection is closed. Use the same value as the
	// clients. Default DefaultLivenessTimeout; at least 300ms.
	LivenessTimeout time.Duration
	// UnaryInterceptor and StreamInterceptor, if set, run around the
	// control calls and the data streams, as grpc.UnaryInterceptor and
	// grpc.StreamInterceptor do for generated services.
	UnaryInterceptor  grpc.UnaryServerInterceptor
	StreamInterceptor grpc.StreamServerInterceptor
}

// EnsureDefaults returns a copy of o with every zero field set to its
// documented default.
func (o ServerOptions) EnsureDefaults() ServerOptions {
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	o.Clock = clock.OrReal(o.Clock)
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.MaxTargets, DefaultMaxTargets)
	def(&o.MaxCapacity, DefaultMaxCapacity)
	def(&o.MaxConnections, DefaultMaxConnections)
	def(&o.MaxConnectionsPerIP, DefaultMaxConnectionsPerIP)
	def(&o.MaxHandshakes, max(min(DefaultMaxHandshakes, o.MaxConnections/2), 1))
	def(&o.MaxHandshakesPerIP, min(DefaultMaxHandshakesPerIP, o.MaxHandshakes))
	if o.HandshakeTimeout == 0 {
		o.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if o.ControlReceiveTimeout == 0 {
		o.ControlReceiveTimeout = DefaultControlReceiveTimeout
	}
	if o.MaxControlBytesPerConnection == 0 {
		o.MaxControlBytesPerConnection = DefaultMaxControlBytesPerConnection
	}
	if o.MaxControlBytesPerIP == 0 {
		o.MaxControlBytesPerIP = max(DefaultMaxControlBytesPerIP, o.MaxControlBytesPerConnection)
	}
	if o.LivenessTimeout == 0 {
		o.LivenessTimeout = DefaultLivenessTimeout
	}
	return o
}

// Validate reports every invalid field, each wrapping
// messaging.ErrInvalidOptions. It expects defaults filled in
// (EnsureDefaults).
func (o ServerOptions) Validate() error {
	p := optcheck.New(messaging.ErrInvalidOptions)
	p.NotTypedNil("Registerer", o.Registerer)
	p.NotTypedNil("Clock", o.Clock)
	p.IntRange("MaxTargets", o.MaxTargets, 1, 1<<20)
	p.IntRange("MaxCapacity", o.MaxCapacity, 1, 1<<30)
	p.IntRange("MaxConnections", o.MaxConnections, 1, 1<<20)
	p.IntRange("MaxConnectionsPerIP", o.MaxConnectionsPerIP, 1, 1<<20)
	p.IntRange("MaxHandshakes", o.MaxHandshakes, 1, max(o.MaxConnections, 1))
	p.IntRange("MaxHandshakesPerIP", o.MaxHandshakesPerIP, 1, max(o.MaxHandshakes, 1))
	p.Require(o.HandshakeTimeout >= 100*time.Millisecond, "HandshakeTimeout %v below 100ms", o.HandshakeTimeout)
	p.Require(o.ControlReceiveTimeout >= 100*time.Millisecond, "ControlReceiveTimeout %v below 100ms", o.ControlReceiveTimeout)
	p.Require(o.MaxControlBytesPerConnection >= maxUpFrameBytes, "MaxControlBytesPerConnection %d below the largest request (%d bytes)",
		o.MaxControlBytesPerConnection, maxUpFrameBytes)
	p.Require(o.MaxControlBytesPerIP >= o.MaxControlBytesPerConnection, "MaxControlBytesPerIP %d below MaxControlBytesPerConnection %d",
		o.MaxControlBytesPerIP, o.MaxControlBytesPerConnection)
	p.Require(o.LivenessTimeout >= 300*time.Millisecond, "LivenessTimeout %v below 300ms", o.LivenessTimeout)
	p.Require(o.TLS == nil || o.Policy != nil, "TLS without a Policy: say which certificate identity may serve which targets")
	p.Require(o.TLS != nil || o.Policy == nil, "a Policy needs TLS: a plaintext peer has no identity")
	if o.Policy != nil {
		if err := o.Policy.Validate(); err != nil {
			p.Addf("%v", err)
		}
	}
	return p.Err()
}

// Server is the event service's end: a messaging.Transport (and
// RoomNotifier) whose targets are collectors connected over gRPC, and the
// server of the service's control plane. Create with NewServer, Start
// with a listener and the control plane, Close to stop.
type Server struct {
	opts   ServerOptions
	log    *zap.Logger
	grpc   *grpc.Server
	cp     messaging.ControlPlane
	grants map[string]grant // nil without a Policy
	conns  *connTracker
	ctl    *controlBudget
	wg     sync.WaitGroup
	met    *serverMetrics

	mu struct {
		sync.Mutex
		peers  map[messaging.Target]*peer
		closed bool
	}

	// knobs are set by tests before Start; zero in production.
	knobs testingKnobs
}

// NewServer validates opts and builds a server. It starts nothing.
// Errors wrap messaging.ErrInvalidOptions, or are the Registerer's.
func NewServer(opts ServerOptions) (*Server, error) {
	opts = opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	s := &Server{opts: opts, log: opts.Logger.Named("remote")}
	if opts.Policy != nil {
		s.grants = opts.Policy.grants()
	}
	s.mu.peers = map[messaging.Target]*peer{}
	s.ctl = newControlBudget(opts.MaxControlBytesPerConnection, opts.MaxControlBytesPerIP)
	s.met = newServerMetrics(s)
	s.conns = newConnTracker(connLimits{max: opts.MaxConnections, maxPerIP: opts.MaxConnectionsPerIP, maxHandshakes: opts.MaxHandshakes,
		maxHandshakesIP: opts.MaxHandshakesPerIP, handshakeTimeout: opts.HandshakeTimeout}, s.log, opts.Clock, s.met.refusedConns.Inc)
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(s.met); err != nil {
			return nil, fmt.Errorf("remote: register metrics: %w", err)
		}
	}
	half := max(opts.LivenessTimeout/2, time.Second) // gRPC's floor for server pings
	sopts := []grpc.ServerOption{grpc.ForceServerCodec(rawCodec{}), grpc.MaxRecvMsgSize(maxUpFrameBytes),
		grpc.MaxSendMsgSize(MaxFrameBytes), grpc.WaitForHandlers(true), grpc.MaxConcurrentStreams(maxStreamsPerConnection),
		grpc.ConnectionTimeout(opts.HandshakeTimeout),
		// Static windows: what gRPC may buffer of a stream nobody reads
		// is controlWindowBytes, which the Control budget charges.
		grpc.InitialWindowSize(controlWindowBytes), grpc.InitialConnWindowSize(controlConnWindowBytes),
		// The transport's own liveness, for connections that carry only
		// control calls: ping after half the timeout idle, close if the
		// ping is not answered in the other half.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: half, Timeout: half}),
		// Clients ping every clientKeepaliveTime; anything more often is
		// abuse (gRPC answers it with GOAWAY).
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: clientKeepaliveTime / 2, PermitWithoutStream: true})}
	if opts.TLS != nil {
		sopts = append(sopts, grpc.Creds(credentials.NewTLS(s.guardTLS(opts.TLS))))
	}
	if opts.UnaryInterceptor != nil {
		sopts = append(sopts, grpc.UnaryInterceptor(opts.UnaryInterceptor))
	}
	if opts.StreamInterceptor != nil {
		sopts = append(sopts, grpc.StreamInterceptor(opts.StreamInterceptor))
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

// Start serves lis, answering control calls with cp, until Close. A
// plaintext server refuses a listener that is not on loopback unless
// AllowInsecureListen is set (ErrInvalidOptions).
func (s *Server) Start(lis net.Listener, cp messaging.ControlPlane) error {
	if cp == nil {
		return fmt.Errorf("%w: nil control plane", messaging.ErrInvalidOptions)
	}
	if s.opts.TLS == nil && !isLoopback(lis.Addr()) {
		if !s.opts.AllowInsecureListen {
			return fmt.Errorf("%w: plaintext on %s, which is not loopback: use TLS, or allow it explicitly (AllowInsecureListen)",
				messaging.ErrInvalidOptions, lis.Addr())
		}
		s.log.Warn("serving plaintext on a non-loopback address: any peer that reaches it may register dispatchers and read their rows",
			zap.Stringer("addr", lis.Addr()))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return messaging.ErrClosed
	}
	s.cp = cp
	tracked := s.conns.listener(lis)
	s.wg.Go(func() {
		if err := s.grpc.Serve(tracked); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.log.Warn("serve ended", zap.Error(err))
		}
	})
	return nil
}

// isLoopback reports whether addr is a loopback TCP address.
func isLoopback(addr net.Addr) bool {
	a, ok := addr.(*net.TCPAddr)
	return ok && a.IP.IsLoopback()
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
	s.conns.close() // connections in their handshake: Stop would wait for them
	s.grpc.Stop()
	s.wg.Wait()
}

// Connected is the number of collectors whose data stream is open.
func (s *Server) Connected() int {
	n := 0
	for _, p := range s.peers() {
		if p.alive() {
			n++
		}
	}
	return n
}

// control answers one control call with the caller's authority on its
// context, so the control plane refuses what the caller's certificate does
// not allow.
func (s *Server) control(ctx context.Context, req []byte) ([]byte, error) {
	a := s.authorityOf(ctx)
	if a != nil {
		ctx = messaging.WithAuthority(ctx, a)
	}
	reply, err := serveControl(ctx, s.cp, a, req, func(err error) {
		// The caller gets a redacted explanation; the whole one is the
		// operator's.
		s.log.Debug("control call refused", zap.String("identity", a.Identity()), zap.Error(err))
	})
	if err != nil {
		s.met.refusedCalls.WithLabelValues("version").Inc()
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	return reply, nil
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
		// One series for every target that never connected: target names
		// come from registrations, and must not grow the series.
		s.met.notConnected.Inc()
		return fmt.Errorf("%w: %q has not connected", messaging.ErrUnknownTarget, target)
	}
	return p.send(msgs)
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
	return p.roomChan()
}

// HasRoom implements messaging.RoomNotifier: whether Room would return a
// closed channel now.
func (s *Server) HasRoom(target messaging.Target) bool {
	s.mu.Lock()
	p := s.mu.peers[target]
	s.mu.Unlock()
	return p == nil || p.hasRoom()
}

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

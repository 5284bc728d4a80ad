package remote

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/cdcflow/eventservice/internal/backoff"
	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// ClientOptions configure a Client.
type ClientOptions struct {
	// Addr is the service's host:port. Required.
	Addr string
	// Target is the name the service sends this collector's messages to.
	// Required.
	Target messaging.Target
	// Capacity is the local inbox's capacity in messages, and so the most
	// messages the service may have in flight to this collector (its
	// credit). Default 4096.
	Capacity int
	// TLS, if set, dials with it (a client certificate in it for mutual
	// TLS); nil dials plaintext.
	TLS *tls.Config
	// RetryBase and RetryMax bound the doubling back-off between
	// reconnects of the data stream. Defaults 50 ms and 2 s. Each delay is
	// shortened by up to 20% at random, so that the collectors of a
	// service that restarted do not all reconnect at once.
	RetryBase, RetryMax time.Duration
	// LivenessTimeout: a data stream on which nothing arrived from the
	// service (it pings every third of its own timeout when idle) for
	// this long, or whose credit grant has been blocked this long, is
	// declared dead: the client drops the connection, dials a new one and
	// opens a new stream (a reconnect). Use the server's value. Default
	// DefaultLivenessTimeout; at least 300ms.
	LivenessTimeout time.Duration
	// CallTimeout bounds a control call that the caller's context does
	// not bound sooner; a call that runs out of it is ErrUnavailable.
	// Default 10 s.
	CallTimeout time.Duration
	// Logger defaults to zap.NewNop(); Clock to the real clock.
	Logger *zap.Logger
	Clock  clock.Clock
	// Registerer, if set, receives the client's metrics
	// (cdcflow_remote_client_*, labelled with the target).
	Registerer prometheus.Registerer
}

// Client is a collector's end: a messaging.ControlPlane whose calls go to
// the service over gRPC, and a data stream whose messages land in a local
// Inbox that the collector reads as it would in-process. Create with
// NewClient, Start, Close.
type Client struct {
	opts  ClientOptions
	log   *zap.Logger
	local *messaging.InProcess
	inbox *messaging.Inbox
	met   *clientMetrics

	cancel context.CancelFunc
	wg     sync.WaitGroup

	// conn is the current connection: replaced (and the old one closed)
	// when the data stream on it is declared dead, since a half-open
	// connection would carry the next stream nowhere either.
	conn atomic.Pointer[grpc.ClientConn]
	// streams counts data streams opened (the first and each reconnect).
	streams atomic.Int64
	// reconnected holds a token after a data stream other than the first
	// opened (capacity 1: reconnects while nobody looked coalesce).
	reconnected chan struct{}

	// knobs are set by tests before Start; zero in production.
	knobs testingKnobs
}

// EnsureDefaults returns a copy of o with every zero field set to its
// documented default.
func (o ClientOptions) EnsureDefaults() ClientOptions {
	if o.Capacity == 0 {
		o.Capacity = 4096
	}
	if o.RetryBase == 0 {
		o.RetryBase = 50 * time.Millisecond
	}
	if o.RetryMax == 0 {
		o.RetryMax = 2 * time.Second
	}
	if o.LivenessTimeout == 0 {
		o.LivenessTimeout = DefaultLivenessTimeout
	}
	if o.CallTimeout == 0 {
		o.CallTimeout = 10 * time.Second
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	o.Clock = clock.OrReal(o.Clock)
	return o
}

// Validate reports every invalid field, joined and wrapping
// messaging.ErrInvalidOptions. It expects defaults filled in
// (EnsureDefaults).
func (o ClientOptions) Validate() error {
	var errs []error
	if o.Addr == "" {
		errs = append(errs, errors.New("Addr is required"))
	}
	if o.Target == "" {
		errs = append(errs, errors.New("Target is required"))
	}
	if o.Capacity < 0 {
		errs = append(errs, fmt.Errorf("Capacity %d is negative", o.Capacity))
	}
	if o.RetryBase < 0 || o.RetryMax < 0 {
		errs = append(errs, errors.New("negative retry bound"))
	}
	if err := o.Target.Validate(); o.Target != "" && err != nil {
		errs = append(errs, err)
	}
	if o.LivenessTimeout < 300*time.Millisecond {
		errs = append(errs, fmt.Errorf("LivenessTimeout %v below 300ms", o.LivenessTimeout))
	}
	if o.CallTimeout < 0 {
		errs = append(errs, fmt.Errorf("CallTimeout %v is negative", o.CallTimeout))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", messaging.ErrInvalidOptions, err)
	}
	return nil
}

// NewClient validates opts and builds the local inbox. It starts nothing
// and makes no connection.
func NewClient(opts ClientOptions) (*Client, error) {
	opts = opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	met, err := newClientMetrics(opts.Registerer, opts.Target)
	if err != nil {
		return nil, fmt.Errorf("remote: register metrics: %w", err)
	}
	local, err := messaging.NewInProcess(messaging.InProcessOptions{Capacity: opts.Capacity})
	if err != nil {
		return nil, err
	}
	inbox, err := local.Register(opts.Target)
	if err != nil {
		return nil, err
	}
	return &Client{opts: opts, log: opts.Logger.Named("remote"), local: local, inbox: inbox, met: met,
		reconnected: make(chan struct{}, 1)}, nil
}

// Inbox is where the service's messages arrive, in order per stream.
func (c *Client) Inbox() *messaging.Inbox { return c.inbox }

// Streams is the number of data streams the service accepted so far: 1
// plus the reconnects (a refused hello is no stream).
func (c *Client) Streams() int64 { return c.streams.Load() }

// Reconnected receives a token after a data stream other than the first
// has opened. Messages sent on the broken stream but not received are
// gone (the collector sees a gap and resets, or re-registers its
// dispatchers when it takes the token); tokens coalesce, so one token may
// stand for several reconnects.
func (c *Client) Reconnected() <-chan struct{} { return c.reconnected }

// clientKeepaliveTime is how often the client's gRPC transport pings an
// idle connection: gRPC's floor for clients. The data stream's own
// liveness (LivenessTimeout) detects a dead link sooner; this covers a
// connection that carries only control calls.
const clientKeepaliveTime = 10 * time.Second

// dial makes a connection (grpc.NewClient connects lazily).
func (c *Client) dial() (*grpc.ClientConn, error) {
	creds := insecure.NewCredentials()
	if c.opts.TLS != nil {
		creds = credentials.NewTLS(c.opts.TLS)
	}
	conn, err := grpc.NewClient(c.opts.Addr, grpc.WithTransportCredentials(creds),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: clientKeepaliveTime, Timeout: c.opts.LivenessTimeout, PermitWithoutStream: true}),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{}), grpc.MaxCallRecvMsgSize(MaxFrameBytes), grpc.MaxCallSendMsgSize(maxUpFrameBytes)))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", messaging.ErrInvalidOptions, err)
	}
	return conn, nil
}

// Start connects and keeps the data stream open, reconnecting with
// back-off, until Close.
func (c *Client) Start() error {
	conn, err := c.dial()
	if err != nil {
		return err
	}
	c.conn.Store(conn)
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	c.wg.Go(func() { c.run(ctx) })
	return nil
}

// Close ends the stream and the connection; the inbox is closed (what it
// holds stays drainable).
func (c *Client) Close() {
	if c.cancel != nil {
		c.cancel()
		c.wg.Wait()
		_ = c.conn.Load().Close()
	}
	c.local.Close()
}

// reconnectJitter is the fraction by which a reconnect's delay is shortened
// at most.
const reconnectJitter = 0.2

// run keeps a data stream open.
func (c *Client) run(ctx context.Context) {
	// Jittered: the collectors of a service that went away all reconnect
	// when it comes back.
	reconnect := backoff.Backoff{Base: c.opts.RetryBase, Max: c.opts.RetryMax, Jitter: reconnectJitter}
	for ctx.Err() == nil {
		opened, err := c.stream(ctx)
		if ctx.Err() != nil {
			return
		}
		if opened {
			reconnect.Reset() // it worked for a while: start the back-off over
		}
		if errors.Is(err, errDeadLink) {
			c.met.deadLinks.Inc()
			c.redial()
		}
		delay := reconnect.Next()
		c.logStreamEnd(err, delay)
		t := c.opts.Clock.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

// logStreamEnd logs why a stream ended: a refusal that retrying will not
// cure (another wire version, a target this collector may not serve) at
// error level, naming what the service said.
func (c *Client) logStreamEnd(err error, delay time.Duration) {
	switch status.Code(err) {
	case codes.FailedPrecondition, codes.Unimplemented, codes.PermissionDenied, codes.InvalidArgument:
		c.log.Error("the service refused the data stream; retrying", zap.String("target", string(c.opts.Target)),
			zap.Int("wire_version", WireVersion), zap.Error(err), zap.Duration("in", delay))
	default:
		c.log.Info("data stream ended; reconnecting", zap.Error(err), zap.Duration("in", delay))
	}
}

// redial replaces the connection: the old one may be half-open, and a new
// stream on it would hang as the last one did. Control calls in flight on
// it fail (ErrUnavailable) and are retried by their callers.
func (c *Client) redial() {
	conn, err := c.dial()
	if err != nil {
		c.log.Warn("redial", zap.Error(err)) // options were valid once: keep the old connection
		return
	}
	if old := c.conn.Swap(conn); old != nil {
		_ = old.Close()
	}
}

// errDeadLink ends a stream whose liveness timeout passed.
var errDeadLink = errors.New("remote: nothing received from the service within the liveness timeout")

// stream runs one data stream until it fails; opened reports whether the
// service accepted its hello (the first frame it sends).
func (c *Client) stream(ctx context.Context) (opened bool, err error) {
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	st, err := c.conn.Load().NewStream(sctx, &grpc.StreamDesc{StreamName: "Data", ServerStreams: true, ClientStreams: true}, dataMethod)
	if err != nil {
		return false, err
	}
	read := &readMark{}
	// What the inbox still holds from the last stream is not free: a
	// collector that stalled opens with no credit and grants as it drains.
	credit := max(c.opts.Capacity-c.inbox.Len(), 0)
	live := newLinkWatch(c.opts.Clock)
	if err := st.SendMsg(&frame{b: appendHello(nil, c.opts.Target, uint32(c.opts.Capacity), uint32(credit))}); err != nil {
		return false, err
	}
	c.met.granted.Add(float64(credit))
	got := make(chan struct{}, 1)
	got <- struct{}{} // look at the inbox once at the start
	var helpers sync.WaitGroup
	defer helpers.Wait()
	helpers.Go(func() { c.grant(sctx, st, int64(credit), got, live, read) })
	helpers.Go(func() { c.watch(sctx, cancel, live) })
	defer cancel(nil) // runs before helpers.Wait: stops them
	for {
		var f frame
		if err := st.RecvMsg(&f); err != nil {
			if cause := context.Cause(sctx); errors.Is(cause, errDeadLink) {
				return opened, cause
			}
			return opened, err
		}
		live.received()
		if !opened {
			// The service answers an accepted hello with a ping at once;
			// a refused one ends the stream instead, and is no stream.
			opened = true
			c.met.streams.Inc()
			if c.streams.Add(1) > 1 {
				select {
				case c.reconnected <- struct{}{}:
				default:
				}
			}
		}
		m, msgs, err := decodeDataFrame(f.b)
		if err != nil {
			return opened, err
		}
		if len(msgs) == 0 {
			continue // a ping
		}
		// The mark counts the stream's weight through this frame: the
		// service's count and ours agree, or it broke the protocol.
		if want := read.load().weight + uint64(messaging.WeightOf(msgs)); m.weight != want {
			return opened, fmt.Errorf("%w: a data frame marked at weight %d, expected %d", ErrMalformed, m.weight, want)
		}
		for _, m := range msgs {
			if err := messaging.Validate(m); err != nil {
				return opened, fmt.Errorf("%w: %w", ErrMalformed, err)
			}
		}
		// Counted before the collector can see them (a scrape after a
		// receive includes them); the read mark, which the granter reads,
		// only once they are in the inbox, or it would grant their room
		// twice.
		c.met.received.Add(float64(len(msgs)))
		if err := c.local.Send(c.opts.Target, msgs); err != nil {
			// The service sent beyond its credit, or the inbox closed.
			return opened, fmt.Errorf("remote: local inbox refused %d messages: %w", len(msgs), err)
		}
		read.store(m) // credit counts weight, as the inbox does
		select {
		case got <- struct{}{}:
		default:
		}
	}
}

// watch ends the stream (cause errDeadLink) once nothing arrived for the
// liveness timeout or a grant has been blocked that long.
func (c *Client) watch(ctx context.Context, cancel context.CancelCauseFunc, live *linkWatch) {
	t := c.knobs.watchdogTicker(c.opts.Clock, c.opts.LivenessTimeout/3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		if live.state(c.opts.LivenessTimeout) != linkAlive {
			c.log.Warn("the service's link is dead: dialling again", zap.String("target", string(c.opts.Target)),
				zap.Duration("liveness_timeout", c.opts.LivenessTimeout))
			cancel(errDeadLink)
			return
		}
	}
}

// grant returns credit to the service as the collector drains the inbox:
// after messages arrived, once the inbox is at or below half, it grants
// what is free and not already granted. When it sent nothing for a third
// of the liveness timeout it sends a zero grant: a ping that tells the
// service this collector is alive.
//
// Every grant echoes the mark of the last frame forwarded into the inbox
// (credit.go), and counts what was received by that same mark, so that
// what it has granted never exceeds the capacity beyond what the mark
// proves read: the service believes no more.
func (c *Client) grant(ctx context.Context, st grpc.ClientStream, granted int64, got <-chan struct{}, live *linkWatch, read *readMark) {
	ping := c.opts.Clock.NewTicker(c.opts.LivenessTimeout / 3)
	defer ping.Stop()
	send := func(n uint32, m mark) bool {
		live.writing()
		err := st.SendMsg(&frame{b: appendCredit(nil, n, m)})
		live.written()
		return err == nil // else the receiver sees the stream fail
	}
	var room <-chan struct{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-ping.C():
			if live.idleSinceLastTick() {
				if !send(0, read.load()) {
					return
				}
				live.pinged()
			}
			continue
		case <-got:
			if room == nil {
				room = c.inbox.Room()
			}
			continue
		case <-room:
			room = nil
		}
		m := read.load()
		outstanding := granted - int64(m.weight)
		free := int64(c.opts.Capacity-c.inbox.Len()) - outstanding
		if free <= 0 {
			continue
		}
		if !send(uint32(free), m) {
			return
		}
		granted += free
		c.met.granted.Add(float64(free))
	}
}

// readMark is the mark of the last data frame of a stream forwarded into
// the inbox: its weight is what the collector received on the stream.
type readMark struct {
	mu sync.Mutex
	m  mark
}

func (r *readMark) load() mark {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.m
}

func (r *readMark) store(m mark) {
	r.mu.Lock()
	r.m = m
	r.mu.Unlock()
}

// call makes one control call, bounded by CallTimeout. A call that fails
// to reach the service, or runs out of time, is ErrUnavailable (wrapping
// the context's error when the caller's context ended it); a service of
// another wire version is ErrVersionMismatch.
func (c *Client) call(ctx context.Context, req []byte) ([]messaging.Code, error) {
	conn := c.conn.Load()
	if conn == nil {
		return nil, fmt.Errorf("%w: client not started", messaging.ErrUnavailable)
	}
	cctx, cancel := context.WithTimeout(ctx, c.opts.CallTimeout)
	defer cancel()
	var reply frame
	if err := conn.Invoke(cctx, controlMethod, &frame{b: req}, &reply); err != nil {
		switch st := status.Convert(err); st.Code() {
		case codes.FailedPrecondition, codes.Unimplemented:
			return nil, fmt.Errorf("%w: %w: this collector speaks wire version %d (%s); the service said: %s",
				messaging.ErrInvalidRequest, ErrVersionMismatch, WireVersion, serviceName, st.Message())
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w: %w", messaging.ErrUnavailable, ctx.Err())
		}
		return nil, fmt.Errorf("%w: %w", messaging.ErrUnavailable, err)
	}
	return decodeReply(reply.b)
}

// Register implements messaging.ControlPlane.
func (c *Client) Register(ctx context.Context, req messaging.RegisterRequest) error {
	if err := req.Validate(); err != nil {
		return err
	}
	_, err := c.call(ctx, appendRegister(nil, req))
	return err
}

// RegisterBatch implements messaging.ControlPlane: one control call per
// part of the batch that fits a frame the service reads (maxUpFrameBytes),
// so a batch of registrations with long span keys is cut in several.
func (c *Client) RegisterBatch(ctx context.Context, req messaging.RegisterBatchRequest) (messaging.RegisterBatchReply, error) {
	if err := req.Validate(); err != nil {
		return messaging.RegisterBatchReply{}, err
	}
	reply := messaging.RegisterBatchReply{Codes: make([]messaging.Code, 0, len(req.Requests))}
	rest := req.Requests
	for len(rest) > 0 {
		n, frame := len(rest), appendRegisterBatch(nil, rest)
		for len(frame) > maxUpFrameBytes && n > 1 {
			n /= 2
			frame = appendRegisterBatch(frame[:0], rest[:n])
		}
		codes, err := c.call(ctx, frame)
		if err == nil && len(codes) != n {
			err = fmt.Errorf("%w: %d codes for %d registrations", messaging.ErrInternal, len(codes), n)
		}
		if err != nil {
			// Entries sent before keep their outcomes; the call's error
			// says the rest were not (all) registered.
			return reply, err
		}
		reply.Codes = append(reply.Codes, codes...)
		rest = rest[n:]
	}
	return reply, nil
}

// Reset implements messaging.ControlPlane.
func (c *Client) Reset(ctx context.Context, req messaging.ResetRequest) error {
	if err := req.Validate(); err != nil {
		return err
	}
	_, err := c.call(ctx, appendReset(nil, req))
	return err
}

// Remove implements messaging.ControlPlane.
func (c *Client) Remove(ctx context.Context, req messaging.RemoveRequest) error {
	if err := req.Validate(); err != nil {
		return err
	}
	_, err := c.call(ctx, appendRemove(nil, req))
	return err
}

// Heartbeat implements messaging.ControlPlane.
func (c *Client) Heartbeat(ctx context.Context, req messaging.HeartbeatRequest) (messaging.HeartbeatReply, error) {
	if err := req.Validate(); err != nil {
		return messaging.HeartbeatReply{}, err
	}
	codes, err := c.call(ctx, appendHeartbeat(nil, req))
	return messaging.HeartbeatReply{Codes: codes}, err
}

var _ messaging.ControlPlane = (*Client)(nil)

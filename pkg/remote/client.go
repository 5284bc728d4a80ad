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
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

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
	// reconnects of the data stream. Defaults 50 ms and 2 s.
	RetryBase, RetryMax time.Duration
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

	conn   *grpc.ClientConn
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// streams counts data streams opened (the first and each reconnect);
	// received counts messages forwarded into the inbox on the current one.
	streams  atomic.Int64
	received atomic.Int64
	// reconnected holds a token after a data stream other than the first
	// opened (capacity 1: reconnects while nobody looked coalesce).
	reconnected chan struct{}
}

// NewClient validates opts and builds the local inbox. It starts nothing
// and makes no connection.
func NewClient(opts ClientOptions) (*Client, error) {
	var errs []error
	if opts.Addr == "" {
		errs = append(errs, errors.New("Addr is required"))
	}
	if opts.Target == "" {
		errs = append(errs, errors.New("Target is required"))
	}
	if opts.Capacity < 0 {
		errs = append(errs, fmt.Errorf("Capacity %d is negative", opts.Capacity))
	}
	if opts.RetryBase < 0 || opts.RetryMax < 0 {
		errs = append(errs, errors.New("negative retry bound"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("%w: %w", messaging.ErrInvalidOptions, err)
	}
	if opts.Capacity == 0 {
		opts.Capacity = 4096
	}
	if opts.RetryBase == 0 {
		opts.RetryBase = 50 * time.Millisecond
	}
	if opts.RetryMax == 0 {
		opts.RetryMax = 2 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
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

// Streams is the number of data streams opened so far: 1 plus the
// reconnects.
func (c *Client) Streams() int64 { return c.streams.Load() }

// Reconnected receives a token after a data stream other than the first
// has opened. Messages sent on the broken stream but not received are
// gone (the collector sees a gap and resets, or re-registers its
// dispatchers when it takes the token); tokens coalesce, so one token may
// stand for several reconnects.
func (c *Client) Reconnected() <-chan struct{} { return c.reconnected }

// Start connects and keeps the data stream open, reconnecting with
// back-off, until Close.
func (c *Client) Start() error {
	creds := insecure.NewCredentials()
	if c.opts.TLS != nil {
		creds = credentials.NewTLS(c.opts.TLS)
	}
	conn, err := grpc.NewClient(c.opts.Addr, grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{}), grpc.MaxCallRecvMsgSize(MaxFrameBytes), grpc.MaxCallSendMsgSize(MaxFrameBytes)))
	if err != nil {
		return fmt.Errorf("%w: %w", messaging.ErrInvalidOptions, err)
	}
	c.conn = conn
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
		_ = c.conn.Close()
	}
	c.local.Close()
}

// run keeps a data stream open.
func (c *Client) run(ctx context.Context) {
	delay := c.opts.RetryBase
	for ctx.Err() == nil {
		opened, err := c.stream(ctx)
		if ctx.Err() != nil {
			return
		}
		if opened {
			delay = c.opts.RetryBase // it worked for a while: start the back-off over
		}
		c.log.Info("data stream ended; reconnecting", zap.Error(err), zap.Duration("in", delay))
		t := c.opts.Clock.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		delay = min(2*delay, c.opts.RetryMax)
	}
}

// stream runs one data stream until it fails; opened reports whether it
// got as far as the hello.
func (c *Client) stream(ctx context.Context) (opened bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.conn.NewStream(sctx, &grpc.StreamDesc{StreamName: "Data", ServerStreams: true, ClientStreams: true}, dataMethod)
	if err != nil {
		return false, err
	}
	c.received.Store(0)
	// What the inbox still holds from the last stream is not free: a
	// collector that stalled opens with no credit and grants as it drains.
	credit := max(c.opts.Capacity-c.inbox.Len(), 0)
	if err := st.SendMsg(&frame{b: appendHello(nil, c.opts.Target, uint32(c.opts.Capacity), uint32(credit))}); err != nil {
		return false, err
	}
	c.met.streams.Inc()
	c.met.granted.Add(float64(credit))
	if c.streams.Add(1) > 1 {
		select {
		case c.reconnected <- struct{}{}:
		default:
		}
	}
	got := make(chan struct{}, 1)
	got <- struct{}{} // look at the inbox once at the start
	var grants sync.WaitGroup
	defer grants.Wait()
	grants.Go(func() { c.grant(sctx, st, int64(credit), got) })
	defer cancel() // runs before grants.Wait: stops the granter
	for {
		var f frame
		if err := st.RecvMsg(&f); err != nil {
			return true, err
		}
		msgs, err := decodeMessages(f.b)
		if err != nil {
			return true, err
		}
		if err := c.local.Send(c.opts.Target, msgs); err != nil {
			// The service sent beyond its credit, or the inbox closed.
			return true, fmt.Errorf("remote: local inbox refused %d messages: %w", len(msgs), err)
		}
		c.received.Add(int64(len(msgs)))
		c.met.received.Add(float64(len(msgs)))
		select {
		case got <- struct{}{}:
		default:
		}
	}
}

// grant returns credit to the service as the collector drains the inbox:
// after messages arrived, once the inbox is at or below half, it grants
// what is free and not already granted.
func (c *Client) grant(ctx context.Context, st grpc.ClientStream, granted int64, got <-chan struct{}) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-got:
		}
		select {
		case <-ctx.Done():
			return
		case <-c.inbox.Room():
		}
		outstanding := granted - c.received.Load()
		free := int64(c.opts.Capacity-c.inbox.Len()) - outstanding
		if free <= 0 {
			continue
		}
		if err := st.SendMsg(&frame{b: appendCredit(nil, uint32(free))}); err != nil {
			return // the receiver sees the stream fail
		}
		granted += free
		c.met.granted.Add(float64(free))
	}
}

// call makes one control call. A failure of the call itself (no
// connection, the service gone) is ErrUnavailable.
func (c *Client) call(ctx context.Context, req []byte) ([]messaging.Code, error) {
	if c.conn == nil {
		return nil, fmt.Errorf("%w: client not started", messaging.ErrUnavailable)
	}
	var reply frame
	if err := c.conn.Invoke(ctx, controlMethod, &frame{b: req}, &reply); err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
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

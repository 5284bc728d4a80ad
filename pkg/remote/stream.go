package remote

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/cdcflow/eventservice/pkg/messaging"
)

// peer is one collector's stream as the sender sees it.
//
// Goroutines of a stream: the handler (hello, then the liveness watchdog),
// its writer (frames and pings down) and its reader (credit and pings up).
// The handler returns only after the writer did, so no SendMsg runs after
// it; the reader ends with the stream.
type peer struct {
	target   messaging.Target
	capacity int      // the capacity the collector announced, capped at MaxCapacity
	remote   string   // the connection's remote address, to close it
	key      *markKey // tags the stream's data frames (credit.go)
	wake     chan struct{}
	counters peerCounters // the target's series, looked up once per stream

	// live is when the reader last received a frame and when the
	// writer's SendMsg in progress began: the watchdog reads both.
	live *linkWatch

	mu struct {
		sync.Mutex
		credit ledger
		queue  [][]byte // encoded frames not yet written to the stream
		broken error    // set once the stream ended
		room   chan struct{}
	}
}

func (p *peer) alive() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mu.broken == nil
}

// poke wakes the writer.
func (p *peer) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// send queues msgs as one frame within the credit.
func (p *peer) send(msgs []messaging.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mu.broken != nil {
		p.counters.unavailable.Inc()
		return fmt.Errorf("%w: %w: %q: %v", messaging.ErrSendFailed, messaging.ErrUnavailable, p.target, p.mu.broken)
	}
	// Credit counts messages by Weight, as the collector's inbox does.
	w := messaging.WeightOf(msgs)
	switch {
	case w > p.capacity:
		p.counters.tooLarge.Inc()
		return fmt.Errorf("%w: %d messages (weight %d), %q takes %d", messaging.ErrBatchTooLarge, len(msgs), w, p.target, p.capacity)
	case uint64(w) > p.mu.credit.available():
		p.counters.busy.Inc()
		return messaging.ErrBusy
	case len(msgs) == 0:
		return nil
	}
	p.counters.sent.Add(float64(len(msgs)))
	p.mu.queue, p.mu.credit.accepted = appendFrames(p.mu.queue, msgs, p.key, p.mu.credit.accepted)
	p.poke()
	return nil
}

func (p *peer) roomChan() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.hasRoomLocked() {
		return closedChan()
	}
	if p.mu.room == nil {
		p.mu.room = make(chan struct{})
	}
	return p.mu.room
}

func (p *peer) hasRoom() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hasRoomLocked()
}

// hasRoomLocked: the stream is gone (the next Send says so) or the
// collector granted back at least half its capacity. REQUIRES: p.mu held.
func (p *peer) hasRoomLocked() bool {
	return p.mu.broken != nil || 2*p.mu.credit.available() >= uint64(p.capacity)
}

// grant applies a credit frame (ledger.grant): an error ends the stream.
func (p *peer) grant(n uint32, m mark) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.mu.credit.grant(p.key, n, m); err != nil {
		return err
	}
	if p.mu.room != nil && p.hasRoomLocked() {
		close(p.mu.room)
		p.mu.room = nil
	}
	return nil
}

// fail marks the stream broken: Sends fail with ErrUnavailable from now
// on and the queued frames are released.
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

// Errors that end a stream.
var (
	// errStreamReplaced ends a collector's old stream when it connects anew.
	errStreamReplaced = errors.New("remote: the collector connected again")
	// errSilentPeer: nothing arrived on the stream (not even a ping) for
	// the liveness timeout: the collector or the link is gone.
	errSilentPeer = errors.New("remote: nothing received from the collector within the liveness timeout")
	// errSendStalled: a frame could not be written for the liveness
	// timeout: the collector stopped reading or the link stopped carrying.
	errSendStalled = errors.New("remote: a send to the collector blocked for the liveness timeout")
)

// liveness reports why the stream is dead, or nil.
func (p *peer) liveness(timeout time.Duration) error {
	switch p.live.state(timeout) {
	case linkSilent:
		return errSilentPeer
	case linkStalled:
		return errSendStalled
	}
	return nil
}

// pingFrame is a data frame of no messages (and the zero mark): the writer
// sends it when it had nothing to send for a third of the liveness
// timeout, so that an idle collector can tell an idle service from a dead
// link.
var pingFrame = func() []byte {
	var e encoder
	e.mark(mark{})
	return appendMessages(e.b, nil)
}()

// data serves one collector's stream: a hello naming its target and
// granting credit, then credit grants (and pings) up; frames (and pings)
// down.
func (s *Server) data(stream grpc.ServerStream) error {
	ctx := stream.Context()
	remote := ""
	if pr, ok := grpcpeer.FromContext(ctx); ok {
		remote = pr.Addr.String()
	}
	f, err := s.awaitHello(stream)
	if errors.Is(err, errNoHello) {
		return s.refuseStream("no_hello", codes.DeadlineExceeded, remote, err)
	}
	if err != nil {
		return err
	}
	h, err := decodeHello(f.b)
	if err != nil {
		reason, code := "malformed", codes.InvalidArgument
		if errors.Is(err, ErrVersionMismatch) {
			reason, code = "version", codes.FailedPrecondition
		}
		return s.refuseStream(reason, code, remote, err)
	}
	if a := s.authorityOf(ctx); !messaging.MayServe(a, h.target) {
		return s.refuseStream("permission_denied", codes.PermissionDenied, remote,
			fmt.Errorf("%w: %q may not serve target %q", messaging.ErrPermissionDenied, a.Identity(), h.target))
	}
	capacity := min(int(h.capacity), s.opts.MaxCapacity)
	p := &peer{target: h.target, capacity: capacity, remote: remote, wake: make(chan struct{}, 1), key: newMarkKey()}
	credit := min(int(h.credit), capacity)
	p.mu.credit = ledger{capacity: uint64(capacity), granted: uint64(credit)}
	p.live = newLinkWatch(s.opts.Clock)
	old, err := s.attach(p)
	if errors.Is(err, messaging.ErrClosed) {
		return status.Error(codes.Unavailable, err.Error())
	}
	if err != nil {
		return s.refuseStream("max_targets", codes.ResourceExhausted, remote, err)
	}
	if old != nil {
		old.fail(errStreamReplaced)
		old.poke()
	}
	s.met.streams.WithLabelValues(string(h.target)).Inc()
	s.log.Info("collector connected", zap.String("target", string(h.target)), zap.String("from", remote),
		zap.Int("credit", credit), zap.Int("capacity", capacity), zap.Uint32("announced_capacity", h.capacity))

	// The reader ends when the stream does, which is after this handler
	// returns; Close waits for it (grpc.WaitForHandlers makes Stop wait
	// for this handler, so the Go happens before Close's Wait).
	s.wg.Go(func() { s.read(stream, p) })
	written := make(chan error, 1)
	s.wg.Go(func() { written <- s.write(stream, p) })
	watch := s.knobs.watchdogTicker(s.opts.Clock, s.opts.LivenessTimeout/3)
	defer watch.Stop()
	for {
		select {
		case err := <-written:
			return err
		case <-watch.C():
			err := p.liveness(s.opts.LivenessTimeout)
			if err == nil {
				continue
			}
			s.met.deadLinks.Inc()
			s.log.Warn("collector link declared dead; closing its connection", zap.String("target", string(p.target)),
				zap.String("from", remote), zap.Error(err))
			p.fail(err)
			p.poke()
			// A writer blocked in SendMsg on a link that does not answer
			// returns once the socket is gone: gRPC fails the transport
			// and cancels its streams.
			s.conns.kill(remote)
			<-written
			return status.Error(codes.Unavailable, err.Error())
		}
	}
}

// errNoHello: a stream opened but sent no hello within the liveness
// timeout; it would otherwise hold its slot for ever.
var errNoHello = errors.New("remote: no hello within the liveness timeout")

// awaitHello receives a stream's first frame, or gives up after the
// liveness timeout. The receive runs on its own goroutine, which ends with
// the stream (when this handler returns, if it gave up).
func (s *Server) awaitHello(stream grpc.ServerStream) (frame, error) {
	type result struct {
		f   frame
		err error
	}
	got := make(chan result, 1)
	s.wg.Go(func() {
		var r result
		r.err = stream.RecvMsg(&r.f)
		got <- r
	})
	timer := s.opts.Clock.NewTimer(s.opts.LivenessTimeout)
	defer timer.Stop()
	select {
	case r := <-got:
		return r.f, r.err
	case <-timer.C():
		return frame{}, errNoHello
	}
}

func (s *Server) refuseStream(reason string, code codes.Code, remote string, err error) error {
	s.met.refusedCalls.WithLabelValues(reason).Inc()
	s.log.Warn("collector stream refused", zap.String("reason", reason), zap.String("from", remote), zap.Error(err))
	return status.Error(code, err.Error())
}

// attach makes p its target's stream, returning the one it replaces. A
// new target beyond MaxTargets takes the place of a broken one, whose
// series go with it; with none broken it is refused.
func (s *Server) attach(p *peer) (*peer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return nil, messaging.ErrClosed
	}
	old := s.mu.peers[p.target]
	if old == nil && len(s.mu.peers) >= s.opts.MaxTargets {
		var evicted messaging.Target
		for t, q := range s.mu.peers {
			if !q.alive() {
				evicted = t
				break
			}
		}
		if evicted == "" {
			return nil, fmt.Errorf("%w: %d targets connected, MaxTargets %d", messaging.ErrLimitExceeded, len(s.mu.peers), s.opts.MaxTargets)
		}
		delete(s.mu.peers, evicted)
		s.met.forget(string(evicted))
	}
	p.counters = s.met.forTarget(string(p.target))
	s.mu.peers[p.target] = p
	return old, nil
}

// read receives credit grants and pings until the stream ends.
func (s *Server) read(stream grpc.ServerStream, p *peer) {
	defer p.poke()
	for {
		var up frame
		if err := stream.RecvMsg(&up); err != nil {
			p.fail(err)
			return
		}
		p.live.received()
		n, m, err := decodeCredit(up.b)
		if err != nil {
			p.fail(fmt.Errorf("%w: expected a credit frame: %w", ErrMalformed, err))
			return
		}
		if err := p.grant(n, m); err != nil {
			s.log.Warn("collector stream ended: it broke the credit protocol", zap.String("target", string(p.target)), zap.Error(err))
			p.fail(err)
			return
		}
		if s.knobs.granted != nil {
			s.knobs.granted()
		}
	}
}

// write sends the queued frames, and a ping when it sent nothing for a
// third of the liveness timeout, until the stream ends or breaks.
func (s *Server) write(stream grpc.ServerStream, p *peer) error {
	ctx := stream.Context()
	ping := s.opts.Clock.NewTicker(s.opts.LivenessTimeout / 3)
	defer ping.Stop()
	// The first frame tells the collector its hello was accepted.
	frames := [][]byte{pingFrame}
	if err := s.sendFrames(stream, p, frames); err != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			p.fail(ctx.Err())
			return ctx.Err()
		case <-ping.C():
			if p.live.idleSinceLastTick() {
				if err := s.sendFrames(stream, p, append(frames[:0], pingFrame)); err != nil {
					return err
				}
				p.live.pinged()
			}
			continue
		case <-p.wake:
		}
		var err error
		if frames, err = p.take(frames[:0]); err != nil {
			s.log.Info("collector stream ended", zap.String("target", string(p.target)), zap.Error(err))
			return err
		}
		if err := s.sendFrames(stream, p, frames); err != nil {
			return err
		}
	}
}

// sendFrames writes frames, recording when each write began for the
// watchdog.
func (s *Server) sendFrames(stream grpc.ServerStream, p *peer, frames [][]byte) error {
	for i, b := range frames {
		p.live.writing()
		err := stream.SendMsg(&frame{b: b})
		p.live.written()
		frames[i] = nil
		if err != nil {
			p.fail(err)
			return err
		}
	}
	return nil
}

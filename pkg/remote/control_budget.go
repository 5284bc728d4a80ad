package remote

import (
	"context"
	"errors"
	"sync"

	"google.golang.org/grpc/codes"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Control requests received in part. A Control call's request is read by
// its handler (gRPC hands it the decoder), so a peer that sends all but
// the last byte of a request holds what was read until it sends the rest:
// 64 such calls per connection held about 27 MiB each connection, for as
// long as the peer answered pings (about 1.7 GiB per host at the limits).
// Now what Control calls can hold is a budget, in bytes, per connection
// (MaxControlBytesPerConnection) and per remote address
// (MaxControlBytesPerIP), and a request must arrive whole within
// ControlReceiveTimeout of its call's start:
//
//   - a call is charged controlWindowBytes when it starts: what gRPC
//     buffers of a stream nobody reads (the server's stream windows are
//     static at that size, so HTTP/2 lets a peer send no more ahead). A
//     call whose charge does not fit is refused at once
//     (ResourceExhausted), and gRPC drops what it had buffered;
//   - before its request is read the charge is raised to maxUpFrameBytes,
//     the most a request can hold; a call waits for that room (holding
//     only its window) until the deadline;
//   - the charge is given back when the read ends: the request arrived,
//     or the call ended (at the deadline the handler returns
//     DeadlineExceeded, gRPC resets the stream, and the read fails).
//
// So a connection's Control calls hold at most MaxControlBytesPerConnection
// and an address's at most MaxControlBytesPerIP, each for at most
// ControlReceiveTimeout per call.

// controlWindowBytes is the server's HTTP/2 stream and initial window:
// static (gRPC's bandwidth-delay estimate would grow it, and with it what
// an unread stream may hold). gRPC's floor.
const controlWindowBytes = 64 << 10

// controlConnWindowBytes is the server's connection window: replenished
// as data arrives, whoever reads it, so it bounds nothing held; large
// enough that a connection's calls do not wait on each other.
const controlConnWindowBytes = 1 << 20

// errControlBudget: the call's connection or address holds its budget of
// Control bytes already.
var errControlBudget = errors.New("remote: this connection's or address's Control calls hold their byte budget")

// errControlReceive: the call's request did not arrive whole within
// ControlReceiveTimeout.
var errControlReceive = errors.New("remote: the control request did not arrive whole within ControlReceiveTimeout")

// controlBudget is the ledger of bytes Control calls may hold.
type controlBudget struct {
	perConn, perIP int64

	mu struct {
		sync.Mutex
		conn    map[string]int64 // by remote address (one per connection)
		ip      map[string]int64
		total   int64
		calls   int           // calls holding a charge
		changed chan struct{} // closed and replaced when a charge is given back
	}
}

func newControlBudget(perConn, perIP int64) *controlBudget {
	b := &controlBudget{perConn: perConn, perIP: perIP}
	b.mu.conn = map[string]int64{}
	b.mu.ip = map[string]int64{}
	b.mu.changed = make(chan struct{})
	return b
}

// take charges n more to conn and ip if both budgets have room, and
// otherwise returns a channel closed at the next give.
func (b *controlBudget) take(conn, ip string, n int64, newCall bool) (bool, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mu.conn[conn]+n > b.perConn || b.mu.ip[ip]+n > b.perIP {
		return false, b.mu.changed
	}
	b.mu.conn[conn] += n
	b.mu.ip[ip] += n
	b.mu.total += n
	if newCall {
		b.mu.calls++
	}
	return true, nil
}

// give returns a call's charge of n.
func (b *controlBudget) give(conn, ip string, n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mu.conn[conn] -= n; b.mu.conn[conn] <= 0 {
		delete(b.mu.conn, conn)
	}
	if b.mu.ip[ip] -= n; b.mu.ip[ip] <= 0 {
		delete(b.mu.ip, ip)
	}
	b.mu.total -= n
	b.mu.calls--
	close(b.mu.changed)
	b.mu.changed = make(chan struct{})
}

// held returns what calls hold: in all, the most any connection and any
// address holds, and the calls holding a charge.
func (b *controlBudget) held() (total, maxConn, maxIP int64, calls int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, v := range b.mu.conn {
		maxConn = max(maxConn, v)
	}
	for _, v := range b.mu.ip {
		maxIP = max(maxIP, v)
	}
	return b.mu.total, maxConn, maxIP, b.mu.calls
}

// receiveControl reads a Control call's request within the budget and the
// deadline (above). dec is gRPC's decoder of the call.
func (s *Server) receiveControl(ctx context.Context, dec func(any) error) ([]byte, error) {
	conn := ""
	if p, ok := grpcpeer.FromContext(ctx); ok {
		conn = p.Addr.String()
	}
	ip := ipOf(conn)
	// The deadline runs from before the charge: a call that holds one
	// has its deadline armed.
	deadline := s.opts.Clock.NewTimer(s.opts.ControlReceiveTimeout)
	defer deadline.Stop()
	if ok, _ := s.ctl.take(conn, ip, controlWindowBytes, true); !ok {
		s.met.refusedCalls.WithLabelValues("control_budget").Inc()
		return nil, status.Error(codes.ResourceExhausted, errControlBudget.Error())
	}
	charge := int64(controlWindowBytes)
	late := func() error {
		s.met.refusedCalls.WithLabelValues("control_deadline").Inc()
		return status.Error(codes.DeadlineExceeded, errControlReceive.Error())
	}
	for raised := false; !raised; {
		var wait <-chan struct{}
		if raised, wait = s.ctl.take(conn, ip, maxUpFrameBytes-controlWindowBytes, false); raised {
			charge = maxUpFrameBytes
			break
		}
		select {
		case <-wait:
		case <-deadline.C():
			s.ctl.give(conn, ip, charge)
			return nil, late()
		case <-ctx.Done():
			s.ctl.give(conn, ip, charge)
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	type result struct {
		f   frame
		err error
	}
	got := make(chan result, 1)
	// The read ends with the stream: when the request arrived, or when
	// this handler returned and gRPC reset the stream.
	s.wg.Go(func() {
		var r result
		r.err = dec(&r.f)
		s.ctl.give(conn, ip, charge)
		got <- r
	})
	select {
	case r := <-got:
		return r.f.b, r.err
	case <-deadline.C():
		return nil, late()
	}
}

package remote

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// WireVersion is the version of the wire encoding this build speaks. A
// collector's hello and every control request carry it after wireMagic;
// the service refuses another version with ErrVersionMismatch naming both,
// instead of decoding garbage. The gRPC service name carries it too
// (serviceName), so a build whose name differs is refused by gRPC itself
// (Unimplemented), which the client reports as the same error.
const WireVersion = 3

// wireMagic opens a hello and a control request: bytes that are not ours
// are malformed, bytes that are ours with another version are a version
// mismatch.
const wireMagic = "CDCF"

// maxUpFrameBytes bounds every frame the service receives: control
// requests and stream frames. The largest valid one is a full heartbeat
// (MaxHeartbeatCheckpoints entries of at most 51 bytes: about 410 KiB);
// a Register with two span keys of common.MaxSpanKeyBytes is smaller. The
// server's gRPC receive limit is this, so a peer cannot make it read and
// copy 64 MiB before refusing.
const maxUpFrameBytes = 64 + messaging.MaxHeartbeatCheckpoints*(16+3*binary.MaxVarintLen64+binary.MaxVarintLen32)

// maxRegisterBytes is the largest valid Register request.
const maxRegisterBytes = 64 + 16 + 3*binary.MaxVarintLen64 + 2*(common.MaxSpanKeyBytes+binary.MaxVarintLen64) +
	messaging.MaxTargetBytes + binary.MaxVarintLen64 + 1 + binary.MaxVarintLen32

func (e *encoder) header() {
	e.b = append(e.b, wireMagic...)
	e.u(WireVersion)
}

// header reads the magic and the version.
func (d *decoder) header() {
	if m := d.Rest(); len(m) < len(wireMagic) || string(m[:len(wireMagic)]) != wireMagic {
		d.Fail("no wire magic (not a cdcflow peer)")
		return
	}
	d.Bytes(uint64(len(wireMagic)), "wire magic")
	if v := d.u(); d.Err() == nil && v != WireVersion {
		d.FailWith(versionError(v))
	}
}

func versionError(peer uint64) error {
	return fmt.Errorf("%w: the peer speaks wire version %d, this build %d", ErrVersionMismatch, peer, WireVersion)
}

func (d *decoder) u32() uint32 {
	v := d.u()
	if v > math.MaxUint32 {
		d.Fail("value over 2^32")
	}
	return uint32(v)
}

// Stream frames, collector -> service.
const (
	frameHello  byte = 1 // target, capacity, credit: the first frame of a stream
	frameCredit byte = 2 // more credit (0: a ping, to show the collector is alive), and the last mark read
)

func appendHello(b []byte, target messaging.Target, capacity, credit uint32) []byte {
	e := encoder{b: b}
	e.header()
	e.byte(frameHello)
	e.str(string(target))
	e.u(uint64(capacity))
	e.u(uint64(credit))
	return e.b
}

// appendCredit encodes a grant of credit and the mark of the last data
// frame the collector read (the zero mark: none yet on this stream).
func appendCredit(b []byte, credit uint32, m mark) []byte {
	e := encoder{b: b}
	e.byte(frameCredit)
	e.u(uint64(credit))
	e.mark(m)
	return e.b
}

// hello is a collector's first stream frame.
type hello struct {
	target   messaging.Target
	capacity uint32
	credit   uint32
}

// decodeHello decodes a hello. The target is checked (Target.Validate)
// before anyone uses it as a map key, a log field or a metric label.
func decodeHello(b []byte) (hello, error) {
	d := newDecoder(b, false)
	d.header()
	if k := d.byte(); d.Err() == nil && k != frameHello {
		d.Failf("stream frame %d before the hello", k)
	}
	h := hello{target: messaging.Target(d.str()), capacity: d.u32(), credit: d.u32()}
	if err := d.end(); err != nil {
		return hello{}, err
	}
	if err := h.target.Validate(); err != nil {
		return hello{}, fmt.Errorf("%w: hello: %w", ErrMalformed, err)
	}
	if h.capacity == 0 || h.credit > h.capacity {
		return hello{}, fmt.Errorf("%w: hello: capacity %d, credit %d (need capacity > 0 and credit <= capacity)", ErrMalformed, h.capacity, h.credit)
	}
	return h, nil
}

// decodeCredit decodes a stream frame after the hello: the credit granted
// and the mark it acknowledges (checked by the server, not here).
func decodeCredit(b []byte) (uint32, mark, error) {
	d := newDecoder(b, false)
	if k := d.byte(); d.Err() == nil && k != frameCredit {
		d.Failf("stream frame %d where credit was expected", k)
	}
	n := d.u32()
	m := d.mark()
	if err := d.end(); err != nil {
		return 0, mark{}, err
	}
	return n, m, nil
}

// Control-plane operations.
const (
	opRegister byte = iota + 1
	opReset
	opRemove
	opHeartbeat
	opRegisterBatch
)

// minRegisterBytes is the fewest bytes a Register's body takes:
// dispatcher (16), registration, table, two key lengths, start-ts, target
// length, replace, slot.
const minRegisterBytes = 16 + 8

func appendRegister(b []byte, r messaging.RegisterRequest) []byte {
	e := encoder{b: b}
	e.header()
	e.byte(opRegister)
	e.register(r)
	return e.b
}

// appendRegisterBatch encodes a batch of registrations. The caller keeps
// it within maxUpFrameBytes (Client.RegisterBatch splits).
func appendRegisterBatch(b []byte, reqs []messaging.RegisterRequest) []byte {
	e := encoder{b: b}
	e.header()
	e.byte(opRegisterBatch)
	e.u(uint64(len(reqs)))
	for _, r := range reqs {
		e.register(r)
	}
	return e.b
}

// register encodes a Register's body.
func (e *encoder) register(r messaging.RegisterRequest) {
	e.id(r.Dispatcher)
	e.u(uint64(r.Registration))
	e.i(r.Span.TableID)
	e.bytes(r.Span.StartKey)
	e.bytes(r.Span.EndKey)
	e.u(uint64(r.StartTs))
	e.str(string(r.Target))
	replace := byte(0)
	if r.Replace {
		replace = 1
	}
	e.byte(replace)
	e.u(uint64(r.Slot))
}

func appendReset(b []byte, r messaging.ResetRequest) []byte {
	e := encoder{b: b}
	e.header()
	e.byte(opReset)
	e.id(r.Dispatcher)
	e.u(uint64(r.Registration))
	e.u(r.Epoch)
	e.u(uint64(r.StartTs))
	return e.b
}

func appendRemove(b []byte, r messaging.RemoveRequest) []byte {
	e := encoder{b: b}
	e.header()
	e.byte(opRemove)
	e.id(r.Dispatcher)
	e.u(uint64(r.Registration))
	return e.b
}

func appendHeartbeat(b []byte, r messaging.HeartbeatRequest) []byte {
	e := encoder{b: b}
	e.header()
	e.byte(opHeartbeat)
	e.u(uint64(len(r.Checkpoints)))
	for _, c := range r.Checkpoints {
		e.id(c.Dispatcher)
		e.u(uint64(c.Registration))
		e.u(c.Epoch)
		e.u(uint64(c.Ts))
		e.u(uint64(c.Slot))
	}
	return e.b
}

// controlRequest is one decoded control call: op says which field is set.
type controlRequest struct {
	op        byte
	register  messaging.RegisterRequest
	batch     messaging.RegisterBatchRequest
	reset     messaging.ResetRequest
	remove    messaging.RemoveRequest
	heartbeat messaging.HeartbeatRequest
}

// decodeControl decodes a control call. Its errors wrap ErrMalformed or
// ErrVersionMismatch; a decoded request still goes through its Validate
// at the control plane.
func decodeControl(b []byte) (controlRequest, error) {
	d := newDecoder(b, false)
	d.header()
	r := controlRequest{op: d.byte()}
	if d.Err() != nil {
		return controlRequest{}, d.Err()
	}
	switch r.op {
	case opRegister:
		r.register = d.register()
	case opRegisterBatch:
		n := d.count(minRegisterBytes, "registrations")
		if d.Err() == nil && (n == 0 || n > messaging.MaxRegisterBatch) {
			d.Failf("%d registrations, 1 to %d", n, messaging.MaxRegisterBatch)
		}
		if d.Err() != nil {
			return controlRequest{}, d.Err()
		}
		r.batch.Requests = make([]messaging.RegisterRequest, n)
		for i := range r.batch.Requests {
			r.batch.Requests[i] = d.register()
		}
	case opReset:
		r.reset = messaging.ResetRequest{Dispatcher: d.id(), Registration: messaging.RegistrationID(d.u()), Epoch: d.u(), StartTs: common.Ts(d.u())}
	case opRemove:
		r.remove = messaging.RemoveRequest{Dispatcher: d.id(), Registration: messaging.RegistrationID(d.u())}
	case opHeartbeat:
		n := d.count(minCheckpointBytes, "checkpoints")
		if n > messaging.MaxHeartbeatCheckpoints {
			d.Failf("%d checkpoints, at most %d", n, messaging.MaxHeartbeatCheckpoints)
		}
		if d.Err() != nil {
			return controlRequest{}, d.Err()
		}
		r.heartbeat.Checkpoints = make([]messaging.DispatcherCheckpoint, n)
		for i := range r.heartbeat.Checkpoints {
			r.heartbeat.Checkpoints[i] = messaging.DispatcherCheckpoint{Dispatcher: d.id(), Registration: messaging.RegistrationID(d.u()),
				Epoch: d.u(), Ts: common.Ts(d.u()), Slot: d.slot()}
		}
	default:
		d.Failf("unknown control op %d", r.op)
	}
	if err := d.end(); err != nil {
		return controlRequest{}, err
	}
	return r, nil
}

// register decodes a Register's body.
func (d *decoder) register() messaging.RegisterRequest {
	var q messaging.RegisterRequest
	q.Dispatcher, q.Registration = d.id(), messaging.RegistrationID(d.u())
	q.Span.TableID = d.i()
	q.Span.StartKey, q.Span.EndKey = d.bytes(), d.bytes()
	q.StartTs, q.Target = common.Ts(d.u()), messaging.Target(d.str())
	switch d.byte() {
	case 0:
	case 1:
		q.Replace = true
	default:
		d.Fail("replace flag not 0 or 1")
	}
	q.Slot = d.slot()
	return q
}

// maxReplyMessage bounds the explanation a reply carries.
const maxReplyMessage = 512

// appendReply encodes a control reply: the call's code, the heartbeat
// codes, and for a failure the service's explanation (cut to
// maxReplyMessage bytes), so that a refused collector can say why.
func appendReply(b []byte, code messaging.Code, codes []messaging.Code, msg string) []byte {
	e := encoder{b: b}
	e.byte(byte(code))
	e.u(uint64(len(codes)))
	for _, c := range codes {
		e.byte(byte(c))
	}
	if len(msg) > maxReplyMessage {
		msg = msg[:maxReplyMessage]
	}
	e.str(msg)
	return e.b
}

// decodeReply decodes a control reply into the heartbeat codes, if any,
// and the call's outcome: the sentinel of its code, with the service's
// explanation (an undecodable reply is ErrInternal).
func decodeReply(b []byte) ([]messaging.Code, error) {
	d := newDecoder(b, false)
	code := messaging.Code(d.byte())
	n := d.count(1, "codes")
	if n > messaging.MaxHeartbeatCheckpoints {
		d.Fail("too many codes")
	}
	if d.Err() != nil {
		return nil, fmt.Errorf("%w: %w", messaging.ErrInternal, d.Err())
	}
	var codes []messaging.Code
	if n > 0 {
		codes = make([]messaging.Code, n)
		for i := range codes {
			codes[i] = messaging.Code(d.byte())
		}
	}
	msgLen := d.u()
	if msgLen > maxReplyMessage {
		d.Failf("a %d-byte message", msgLen)
	}
	msg := string(d.take(msgLen))
	if err := d.end(); err != nil {
		return nil, fmt.Errorf("%w: %w", messaging.ErrInternal, err)
	}
	if err := code.Err(); err != nil && msg != "" {
		return codes, fmt.Errorf("%w: the service said: %q", err, msg)
	}
	return codes, code.Err()
}

// serveControl decodes one control call, runs it on cp and encodes the
// reply. A call that does not decode is answered CodeInvalidRequest; one
// of another wire version fails the call itself (ErrVersionMismatch),
// which the caller's client reports naming both versions. With a caller's
// authority (the server has a Policy) the reply is redacted
// (redactedReply) and refused is given the service's own explanation, for
// the service's log.
func serveControl(ctx context.Context, cp messaging.ControlPlane, auth messaging.Authority, b []byte, refused func(error)) ([]byte, error) {
	r, err := decodeControl(b)
	if errors.Is(err, ErrVersionMismatch) {
		return nil, err
	}
	if err != nil {
		// What the decoder says is about the caller's own bytes.
		err = fmt.Errorf("%w: %w", messaging.ErrInvalidRequest, err)
		return appendReply(nil, messaging.CodeOf(err), nil, err.Error()), nil
	}
	var codes []messaging.Code
	switch r.op {
	case opRegister:
		err = cp.Register(ctx, r.register)
	case opRegisterBatch:
		var reply messaging.RegisterBatchReply
		reply, err = cp.RegisterBatch(ctx, r.batch)
		codes = reply.Codes
	case opReset:
		err = cp.Reset(ctx, r.reset)
	case opRemove:
		err = cp.Remove(ctx, r.remove)
	case opHeartbeat:
		var reply messaging.HeartbeatReply
		reply, err = cp.Heartbeat(ctx, r.heartbeat)
		codes = reply.Codes
	}
	if auth != nil {
		if err != nil && refused != nil {
			refused(err)
		}
		code, msg := redactedReply(auth, r, err, codes)
		return appendReply(nil, code, codes, msg), nil
	}
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	return appendReply(nil, messaging.CodeOf(err), codes, msg), nil
}

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

// The wire encoding. Every frame is one gRPC message; the codec (codec.go)
// hands its bytes through untouched. Integers are uvarints (varints for
// signed ones) except dispatcher IDs, which are two fixed 8-byte words;
// byte strings are a uvarint length+1 then the bytes, so that a nil slice
// (length 0) and an empty one (length 1) survive the trip, as rows'
// OldValue needs.
//
//	data frame    = count, message*                  (service -> collector)
//	message       = kind, dispatcher, registration, epoch, seq, body
//	Handshake     = start-ts
//	DMLBatch      = partial, rows, (op, key, value, old-value, start-ts, commit-ts)*
//	DDL           = table-id, commit-ts, query
//	Resolved      = ts
//	stream frame  = hello(target, capacity, credit) | credit(n)  (collector -> service)
//	control call  = op, request                      (collector -> service)
//	control reply = code, [heartbeat codes]

// ErrMalformed: a frame that does not decode. Whoever receives one drops
// the stream (the peer speaks another protocol or is broken).
var ErrMalformed = errors.New("remote: malformed frame")

// maxFrameMessages bounds a data frame's count before anything is
// allocated for it, so a corrupt count cannot make the receiver allocate
// gigabytes.
const maxFrameMessages = 1 << 20

type encoder struct{ b []byte }

func (e *encoder) u(v uint64)  { e.b = binary.AppendUvarint(e.b, v) }
func (e *encoder) i(v int64)   { e.b = binary.AppendVarint(e.b, v) }
func (e *encoder) byte(v byte) { e.b = append(e.b, v) }
func (e *encoder) bytes(v []byte) {
	if v == nil {
		e.u(0)
		return
	}
	e.u(uint64(len(v)) + 1)
	e.b = append(e.b, v...)
}
func (e *encoder) str(v string) { e.u(uint64(len(v))); e.b = append(e.b, v...) }
func (e *encoder) id(d common.DispatcherID) {
	e.b = binary.BigEndian.AppendUint64(e.b, d.Hi)
	e.b = binary.BigEndian.AppendUint64(e.b, d.Lo)
}

// decoder reads what encoder wrote; the first error sticks and every read
// after it returns zero values, so callers check err once at the end.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrMalformed, what)
	}
	d.b = nil
}

func (d *decoder) u() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad uvarint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) i() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) byte() byte {
	if len(d.b) < 1 {
		d.fail("short frame")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

// take returns the next n bytes, copied: frames are reused by gRPC.
func (d *decoder) take(n uint64) []byte {
	if n > uint64(len(d.b)) {
		d.fail("length past the frame's end")
		return nil
	}
	v := append([]byte(nil), d.b[:n]...)
	d.b = d.b[n:]
	return v
}

func (d *decoder) bytes() []byte {
	n := d.u()
	if n == 0 {
		return nil
	}
	v := d.take(n - 1)
	if v == nil && d.err == nil {
		v = []byte{}
	}
	return v
}

func (d *decoder) str() string { return string(d.take(d.u())) }

func (d *decoder) id() common.DispatcherID {
	if len(d.b) < 16 {
		d.fail("short dispatcher id")
		return common.DispatcherID{}
	}
	v := common.DispatcherID{Hi: binary.BigEndian.Uint64(d.b), Lo: binary.BigEndian.Uint64(d.b[8:])}
	d.b = d.b[16:]
	return v
}

func (d *decoder) end() error {
	if d.err == nil && len(d.b) != 0 {
		d.fail(fmt.Sprintf("%d bytes after the end", len(d.b)))
	}
	return d.err
}

// appendMessages encodes msgs as one data frame. REQUIRES: no nil element
// (Send validates first).
func appendMessages(b []byte, msgs []messaging.Message) []byte {
	e := encoder{b: b}
	e.u(uint64(len(msgs)))
	for _, m := range msgs {
		h := m.MessageHeader()
		e.byte(byte(m.Kind()))
		e.id(h.Dispatcher)
		e.u(uint64(h.Registration))
		e.u(h.Epoch)
		e.u(h.Seq)
		switch m := m.(type) {
		case *messaging.Handshake:
			e.u(uint64(m.StartTs))
		case *messaging.DMLBatch:
			if m.Partial {
				e.byte(1)
			} else {
				e.byte(0)
			}
			e.u(uint64(len(m.Rows)))
			for i := range m.Rows {
				r := &m.Rows[i]
				e.byte(byte(r.Op))
				e.bytes(r.Key)
				e.bytes(r.Value)
				e.bytes(r.OldValue)
				e.u(uint64(r.StartTs))
				e.u(uint64(r.CommitTs))
			}
		case *messaging.DDL:
			e.i(m.TableID)
			e.u(uint64(m.CommitTs))
			e.str(m.Query)
		case *messaging.Resolved:
			e.u(uint64(m.Ts))
		}
	}
	return e.b
}

// decodeMessages decodes a data frame.
func decodeMessages(b []byte) ([]messaging.Message, error) {
	d := decoder{b: b}
	n := d.u()
	if n > maxFrameMessages || n > uint64(len(b)) {
		return nil, fmt.Errorf("%w: %d messages in a %d-byte frame", ErrMalformed, n, len(b))
	}
	msgs := make([]messaging.Message, 0, n)
	for range n {
		kind := messaging.Kind(d.byte())
		h := messaging.Header{Dispatcher: d.id(), Registration: messaging.RegistrationID(d.u()), Epoch: d.u(), Seq: d.u()}
		switch kind {
		case messaging.KindHandshake:
			msgs = append(msgs, &messaging.Handshake{Header: h, StartTs: common.Ts(d.u())})
		case messaging.KindDMLBatch:
			m := &messaging.DMLBatch{Header: h, Partial: d.byte() == 1}
			rows := d.u()
			if rows > uint64(len(d.b)) {
				d.fail("row count past the frame's end")
			}
			m.Rows = make([]common.Row, rows)
			for i := range m.Rows {
				r := &m.Rows[i]
				r.Op = common.OpType(d.byte())
				r.Key, r.Value, r.OldValue = d.bytes(), d.bytes(), d.bytes()
				r.StartTs, r.CommitTs = common.Ts(d.u()), common.Ts(d.u())
			}
			msgs = append(msgs, m)
		case messaging.KindDDL:
			msgs = append(msgs, &messaging.DDL{Header: h, TableID: d.i(), CommitTs: common.Ts(d.u()), Query: d.str()})
		case messaging.KindResolved:
			msgs = append(msgs, &messaging.Resolved{Header: h, Ts: common.Ts(d.u())})
		default:
			d.fail(fmt.Sprintf("unknown message kind %d", kind))
		}
		if d.err != nil {
			return nil, d.err
		}
	}
	if err := d.end(); err != nil {
		return nil, err
	}
	return msgs, nil
}

// Stream frames, collector -> service.
const (
	frameHello  byte = 1 // target, capacity, credit: the first frame of a stream
	frameCredit byte = 2 // more credit
)

func appendHello(b []byte, target messaging.Target, capacity, credit uint32) []byte {
	e := encoder{b: b}
	e.byte(frameHello)
	e.str(string(target))
	e.u(uint64(capacity))
	e.u(uint64(credit))
	return e.b
}

func appendCredit(b []byte, credit uint32) []byte {
	e := encoder{b: b}
	e.byte(frameCredit)
	e.u(uint64(credit))
	return e.b
}

// upFrame is a collector's stream frame: a hello (target and capacity
// set) or a credit grant.
type upFrame struct {
	kind     byte
	target   messaging.Target
	capacity uint32
	credit   uint32
}

func decodeUp(b []byte) (upFrame, error) {
	d := decoder{b: b}
	f := upFrame{kind: d.byte()}
	switch f.kind {
	case frameHello:
		f.target = messaging.Target(d.str())
		f.capacity = d.u32()
	case frameCredit:
	default:
		d.fail(fmt.Sprintf("unknown stream frame %d", f.kind))
	}
	f.credit = d.u32()
	return f, d.end()
}

func (d *decoder) u32() uint32 {
	v := d.u()
	if v > math.MaxUint32 {
		d.fail("value over 2^32")
	}
	return uint32(v)
}

// Control-plane operations.
const (
	opRegister byte = iota + 1
	opReset
	opRemove
	opHeartbeat
)

func appendRegister(b []byte, r messaging.RegisterRequest) []byte {
	e := encoder{b: b}
	e.byte(opRegister)
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
	return e.b
}

func appendReset(b []byte, r messaging.ResetRequest) []byte {
	e := encoder{b: b}
	e.byte(opReset)
	e.id(r.Dispatcher)
	e.u(uint64(r.Registration))
	e.u(r.Epoch)
	e.u(uint64(r.StartTs))
	return e.b
}

func appendRemove(b []byte, r messaging.RemoveRequest) []byte {
	e := encoder{b: b}
	e.byte(opRemove)
	e.id(r.Dispatcher)
	e.u(uint64(r.Registration))
	return e.b
}

func appendHeartbeat(b []byte, r messaging.HeartbeatRequest) []byte {
	e := encoder{b: b}
	e.byte(opHeartbeat)
	e.u(uint64(len(r.Checkpoints)))
	for _, c := range r.Checkpoints {
		e.id(c.Dispatcher)
		e.u(uint64(c.Registration))
		e.u(c.Epoch)
		e.u(uint64(c.Ts))
	}
	return e.b
}

// serveControl decodes one control call, runs it on cp and encodes the
// reply. A call that does not decode is answered CodeInvalidRequest.
func serveControl(ctx context.Context, cp messaging.ControlPlane, b []byte) []byte {
	d := decoder{b: b}
	var err error
	var codes []messaging.Code
	switch op := d.byte(); op {
	case opRegister:
		r := messaging.RegisterRequest{Dispatcher: d.id(), Registration: messaging.RegistrationID(d.u())}
		r.Span.TableID = d.i()
		r.Span.StartKey, r.Span.EndKey = d.bytes(), d.bytes()
		r.StartTs, r.Target = common.Ts(d.u()), messaging.Target(d.str())
		r.Replace = d.byte() == 1
		if err = d.end(); err == nil {
			err = cp.Register(ctx, r)
		}
	case opReset:
		r := messaging.ResetRequest{Dispatcher: d.id(), Registration: messaging.RegistrationID(d.u()), Epoch: d.u(), StartTs: common.Ts(d.u())}
		if err = d.end(); err == nil {
			err = cp.Reset(ctx, r)
		}
	case opRemove:
		r := messaging.RemoveRequest{Dispatcher: d.id(), Registration: messaging.RegistrationID(d.u())}
		if err = d.end(); err == nil {
			err = cp.Remove(ctx, r)
		}
	case opHeartbeat:
		n := d.u()
		if n > messaging.MaxHeartbeatCheckpoints {
			d.fail("too many checkpoints")
			n = 0
		}
		r := messaging.HeartbeatRequest{Checkpoints: make([]messaging.DispatcherCheckpoint, n)}
		for i := range r.Checkpoints {
			r.Checkpoints[i] = messaging.DispatcherCheckpoint{Dispatcher: d.id(), Registration: messaging.RegistrationID(d.u()),
				Epoch: d.u(), Ts: common.Ts(d.u())}
		}
		if err = d.end(); err == nil {
			var reply messaging.HeartbeatReply
			reply, err = cp.Heartbeat(ctx, r)
			codes = reply.Codes
		}
	default:
		d.fail(fmt.Sprintf("unknown control op %d", op))
		err = d.err
	}
	if errors.Is(err, ErrMalformed) {
		err = fmt.Errorf("%w: %w", messaging.ErrInvalidRequest, err)
	}
	e := encoder{}
	e.byte(byte(messaging.CodeOf(err)))
	e.u(uint64(len(codes)))
	for _, c := range codes {
		e.byte(byte(c))
	}
	return e.b
}

// decodeReply decodes a control reply into the heartbeat codes, if any,
// and the call's outcome: the sentinel of its code (an undecodable reply
// is ErrInternal).
func decodeReply(b []byte) ([]messaging.Code, error) {
	d := decoder{b: b}
	code := messaging.Code(d.byte())
	n := d.u()
	if n > messaging.MaxHeartbeatCheckpoints {
		d.fail("too many codes")
		n = 0
	}
	codes := make([]messaging.Code, n)
	for i := range codes {
		codes[i] = messaging.Code(d.byte())
	}
	if err := d.end(); err != nil {
		return nil, fmt.Errorf("%w: %w", messaging.ErrInternal, err)
	}
	if n == 0 {
		codes = nil
	}
	return codes, code.Err()
}

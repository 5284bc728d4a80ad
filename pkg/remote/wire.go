package remote

import (
	"encoding/binary"
	"math/bits"

	"github.com/cdcflow/eventservice/internal/wirereader"
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
//	data frame    = mark, count, message*            (service -> collector; count 0: a ping, zero mark)
//	mark          = weight, tag(8 bytes)             (markKey.mark: what a credit frame echoes)
//	message       = kind, dispatcher, registration, epoch, seq, body
//	              | kind(resolved batch), count, (dispatcher, registration, epoch, seq, ts, slot)*
//	Handshake     = start-ts, slot
//	DMLBatch      = partial, rows, (op, key, value, old-value, start-ts, commit-ts)*
//	DDL           = table-id, commit-ts, query
//	Resolved      = ts, slot
//	stream frame  = magic, version, hello(target, capacity, credit)   (collector -> service, first)
//	              | credit(n, mark)                                   (then; n = 0: a ping)
//	control call  = magic, version, op, request      (collector -> service)
//	control reply = code, [heartbeat codes]
//
// Decoding trusts nothing: every count and length is checked against the
// bytes that remain before anything is allocated for it, using the
// fewest bytes an element can take (minMessageBytes, minRowBytes, ...), so
// what a frame makes the receiver allocate is bounded by a small multiple
// of its size (maxDecodeAmplification), whatever its bytes say.

// The fewest bytes an encoded element takes. A count is refused when the
// bytes left could not hold that many elements.
const (
	// kind, dispatcher (16), registration, epoch, seq (a byte each at
	// least) and the smallest body (a one-byte ts).
	minMessageBytes = 1 + 16 + 3 + 1
	// op, three byte strings (a length byte each) and two ts.
	minRowBytes = 1 + 3 + 2
	// dispatcher (16), registration, epoch, ts, slot.
	minCheckpointBytes = 16 + 4
	// a batch's entry: dispatcher (16), registration, epoch, seq, ts, slot.
	minBatchEntryBytes = 16 + 5
)

// maxDecodeAmplification bounds the bytes decoding a frame allocates, as
// a multiple of the frame's size (TestDecodeAllocationIsBoundedByTheFrame):
// a row is a common.Row (96 bytes) per minRowBytes of frame plus its
// copied bytes, a message its struct and interface per minMessageBytes.
const maxDecodeAmplification = 24

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

// decoder reads what encoder wrote, through wirereader: the first error
// sticks and every read after it returns zero values, so callers check
// Err once at the end.
type decoder struct {
	wirereader.Reader
	// owned: the frame is the caller's to give (a data frame: the
	// client's own copy of what gRPC received, never written again), so
	// take returns sub-slices of it, each capped so that an append to it
	// cannot reach the next, instead of copying: a row kept keeps its
	// frame, which its neighbours, applied and checkpointed with it,
	// release at the same time. Copying the fields into a slab of their
	// own was a second copy of every frame, and a zeroed allocation of its
	// size, in a collector process. Control frames copy per field, since a
	// registration's span keys live as long as the dispatcher.
	owned bool
}

// newDecoder returns a decoder of b; owned says whether b is the
// decoder's to keep (see decoder.owned).
func newDecoder(b []byte, owned bool) decoder {
	return decoder{Reader: wirereader.New(b, ErrMalformed), owned: owned}
}

// The encoder's vocabulary, read back.
func (d *decoder) u() uint64   { return d.Uvarint() }
func (d *decoder) i() int64    { return d.Varint() }
func (d *decoder) byte() byte  { return d.U8("frame") }
func (d *decoder) end() error  { return d.End("the end") }
func (d *decoder) str() string { return d.String(d.u(), "string") }

// take returns the next n bytes: a capped sub-slice of an owned frame, a
// copy of any other.
func (d *decoder) take(n uint64) []byte {
	v := d.Bytes(n, "byte string")
	if d.owned {
		return v
	}
	return append([]byte(nil), v...)
}

func (d *decoder) bytes() []byte {
	n := d.u()
	if n == 0 {
		return nil
	}
	v := d.take(n - 1)
	if v == nil && d.Err() == nil {
		v = []byte{}
	}
	return v
}

// id reads a dispatcher ID: two big-endian words, taken in one read.
func (d *decoder) id() common.DispatcherID {
	b := d.Bytes(16, "dispatcher id")
	if len(b) < 16 {
		return common.DispatcherID{}
	}
	return common.DispatcherID{Hi: binary.BigEndian.Uint64(b), Lo: binary.BigEndian.Uint64(b[8:])}
}

// appendMessages encodes msgs as one data frame. REQUIRES: no nil element
// (Send validates first).
func appendMessages(b []byte, msgs []messaging.Message) []byte {
	e := encoder{b: b}
	e.u(uint64(len(msgs)))
	for _, m := range msgs {
		e.message(m)
	}
	return e.b
}

// frameTargetBytes is the size at which a Send's frames are cut (between
// messages): the service's liveness watchdog times each frame's write, so
// a frame must cross a slow link well within the liveness timeout. A
// single message is never split; the largest (a DML batch, bounded by the
// scan's byte limit or a large transaction's split) sets the slowest link
// the defaults suit: 4 MiB in 6 s, about 6 Mbit/s.
const frameTargetBytes = 256 << 10

// appendFrames encodes msgs as data frames of about frameTargetBytes or
// fewer (one message larger than that is a frame of its own), appended to
// dst in order. Each frame is its own allocation, of the frame's exact
// size (encodedSize): growing it by appends copied every frame about
// twice. The mark and the count are written in front of the messages, in
// room reserved for them. Each frame's mark is key's for the stream's
// weight through that frame, from sent (the weight of the frames before);
// appendFrames returns the weight through the last.
func appendFrames(dst [][]byte, msgs []messaging.Message, key *markKey, sent uint64) ([][]byte, uint64) {
	const reserve = maxMarkBytes + binary.MaxVarintLen64
	for len(msgs) > 0 {
		// The frame's messages: up to and including the one that reaches
		// frameTargetBytes, as the encoding below cuts them.
		n, size := 0, 0
		for n < len(msgs) && size < frameTargetBytes {
			size += encodedSize(msgs[n])
			n++
		}
		e := encoder{b: make([]byte, reserve, reserve+size)}
		for _, m := range msgs[:n] {
			e.message(m)
		}
		sent += uint64(messaging.WeightOf(msgs[:n]))
		var head [reserve]byte
		h := encoder{b: head[:0]}
		h.mark(key.mark(sent))
		h.u(uint64(n))
		k := len(h.b)
		copy(e.b[reserve-k:], h.b)
		dst = append(dst, e.b[reserve-k:])
		msgs = msgs[n:]
	}
	return dst, sent
}

// decodeDataFrame decodes a data frame: its mark and its messages
// (decodeMessages, which keeps b).
func decodeDataFrame(b []byte) (mark, []messaging.Message, error) {
	d := newDecoder(b, true)
	m := d.mark()
	if err := d.Err(); err != nil {
		return mark{}, nil, err
	}
	msgs, err := decodeMessages(d.Rest())
	return m, msgs, err
}

// uvarintSize is the length of v as binary.AppendUvarint writes it.
func uvarintSize(v uint64) int { return (bits.Len64(v|1) + 6) / 7 }

// bytesSize is the length of v as encoder.bytes writes it.
func bytesSize(v []byte) int {
	if v == nil {
		return 1
	}
	return uvarintSize(uint64(len(v))+1) + len(v)
}

// encodedSize is the exact length encoder.message writes for m
// (TestEncodedSizeIsExact). REQUIRES: m is not nil.
func encodedSize(m messaging.Message) int {
	const idSize = 16
	if b, ok := m.(*messaging.ResolvedBatch); ok {
		n := 1 + uvarintSize(uint64(len(b.Entries)))
		for i := range b.Entries {
			r := &b.Entries[i]
			n += idSize + uvarintSize(uint64(r.Registration)) + uvarintSize(r.Epoch) + uvarintSize(r.Seq) +
				uvarintSize(uint64(r.Ts)) + uvarintSize(uint64(r.Slot))
		}
		return n
	}
	h := m.MessageHeader()
	n := 1 + idSize + uvarintSize(uint64(h.Registration)) + uvarintSize(h.Epoch) + uvarintSize(h.Seq)
	switch m := m.(type) {
	case *messaging.Handshake:
		n += uvarintSize(uint64(m.StartTs)) + uvarintSize(uint64(m.Slot))
	case *messaging.DMLBatch:
		n += 1 + uvarintSize(uint64(len(m.Rows)))
		for i := range m.Rows {
			r := &m.Rows[i]
			n += 1 + bytesSize(r.Key) + bytesSize(r.Value) + bytesSize(r.OldValue) +
				uvarintSize(uint64(r.StartTs)) + uvarintSize(uint64(r.CommitTs))
		}
	case *messaging.DDL:
		zigzag := uint64(m.TableID) << 1 // as binary.AppendVarint
		if m.TableID < 0 {
			zigzag = ^zigzag
		}
		n += uvarintSize(zigzag) + uvarintSize(uint64(m.CommitTs)) +
			uvarintSize(uint64(len(m.Query))) + len(m.Query)
	case *messaging.Resolved:
		n += uvarintSize(uint64(m.Ts)) + uvarintSize(uint64(m.Slot))
	}
	return n
}

// message encodes one message. REQUIRES: m is not nil.
func (e *encoder) message(m messaging.Message) {
	if b, ok := m.(*messaging.ResolvedBatch); ok {
		e.byte(byte(messaging.KindResolvedBatch))
		e.u(uint64(len(b.Entries)))
		for i := range b.Entries {
			r := &b.Entries[i]
			e.id(r.Dispatcher)
			e.u(uint64(r.Registration))
			e.u(r.Epoch)
			e.u(r.Seq)
			e.u(uint64(r.Ts))
			e.u(uint64(r.Slot))
		}
		return
	}
	h := m.MessageHeader()
	e.byte(byte(m.Kind()))
	e.id(h.Dispatcher)
	e.u(uint64(h.Registration))
	e.u(h.Epoch)
	e.u(h.Seq)
	switch m := m.(type) {
	case *messaging.Handshake:
		e.u(uint64(m.StartTs))
		e.u(uint64(m.Slot))
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
		e.u(uint64(m.Slot))
	}
}

// count reads a count of elements that take at least minBytes each, and
// fails if the bytes left cannot hold them: nothing is allocated for a
// count the frame does not back.
func (d *decoder) count(minBytes int, what string) int {
	return d.Count(d.u(), minBytes, what)
}

// decodeMessages decodes a data frame. It keeps b: the messages' keys and
// values are sub-slices of it, so the caller gives b up (never writes it
// again). The client's b is its own copy of a received frame (rawCodec's
// Unmarshal), one per frame.
func decodeMessages(b []byte) ([]messaging.Message, error) {
	d := newDecoder(b, true)
	n := d.count(minMessageBytes, "messages")
	if d.Err() != nil {
		return nil, d.Err()
	}
	msgs := make([]messaging.Message, 0, n)
	// Resolved-ts messages, most of a frame at scale, share one slab (one
	// allocation for the GC, not one each). Its capacity is the messages
	// left when the first one is met, so appends never move it (a move
	// would be correct, the earlier messages staying in the old array, but
	// two slabs), and it is bounded by the frame's size like msgs.
	var resolved []messaging.Resolved
	for i := range n {
		kind := messaging.Kind(d.byte())
		if kind == messaging.KindResolvedBatch {
			if b := d.resolvedBatch(); d.Err() == nil {
				msgs = append(msgs, b)
				continue
			}
			return nil, d.Err()
		}
		h := messaging.Header{Dispatcher: d.id(), Registration: messaging.RegistrationID(d.u()), Epoch: d.u(), Seq: d.u()}
		switch kind {
		case messaging.KindHandshake:
			msgs = append(msgs, &messaging.Handshake{Header: h, StartTs: common.Ts(d.u()), Slot: d.slot()})
		case messaging.KindDMLBatch:
			m := &messaging.DMLBatch{Header: h, Partial: d.byte() == 1}
			rows := d.count(minRowBytes, "rows")
			if d.Err() != nil {
				return nil, d.Err()
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
			if resolved == nil {
				resolved = make([]messaging.Resolved, 0, n-i)
			}
			resolved = append(resolved, messaging.Resolved{Header: h, Ts: common.Ts(d.u()), Slot: d.slot()})
			msgs = append(msgs, &resolved[len(resolved)-1])
		default:
			d.Failf("unknown message kind %d", kind)
		}
		if d.Err() != nil {
			return nil, d.Err()
		}
	}
	if err := d.end(); err != nil {
		return nil, err
	}
	return msgs, nil
}

// resolvedBatch decodes a ResolvedBatch's body: 1 to
// messaging.MaxResolvedBatchEntries entries, counted against the bytes
// left.
func (d *decoder) resolvedBatch() *messaging.ResolvedBatch {
	n := d.count(minBatchEntryBytes, "resolved-ts entries")
	if d.Err() == nil && (n == 0 || n > messaging.MaxResolvedBatchEntries) {
		d.Failf("resolved-ts batch of %d entries (1 to %d)", n, messaging.MaxResolvedBatchEntries)
	}
	if d.Err() != nil {
		return nil
	}
	b := &messaging.ResolvedBatch{Entries: make([]messaging.Resolved, n)}
	for i := range b.Entries {
		r := &b.Entries[i]
		r.Header = messaging.Header{Dispatcher: d.id(), Registration: messaging.RegistrationID(d.u()), Epoch: d.u(), Seq: d.u()}
		r.Ts, r.Slot = common.Ts(d.u()), d.slot()
	}
	return b
}

// slot reads a slot, which must fit 32 bits.
func (d *decoder) slot() uint32 {
	v := d.u()
	if v > 1<<32-1 {
		d.Failf("slot %d does not fit 32 bits", v)
		return 0
	}
	return uint32(v)
}

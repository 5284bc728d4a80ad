package remote

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// The wire encoding against protobuf's wire format for the frame that
// dominates a changefeed: one DMLBatch. The protobuf side is hand-written
// with protowire, field for field what generated code for this schema
// would write:
//
//	message Row     { uint32 op = 1; bytes key = 2; bytes value = 3; bytes old_value = 4; uint64 start_ts = 5; uint64 commit_ts = 6; }
//	message Message { uint32 kind = 1; bytes dispatcher = 2; uint64 registration = 3; uint64 epoch = 4; uint64 seq = 5; bool partial = 6; repeated Row rows = 7; }
//	message Frame   { repeated Message msgs = 1; }
//
// with a size pass first (nested messages are length-prefixed), and decoded
// straight into messaging types. That is a lower bound on generated code's
// cost, which would also convert between its structs and messaging's.

func protoRowSize(r *common.Row) int {
	n := protowire.SizeTag(1) + protowire.SizeVarint(uint64(r.Op))
	n += protowire.SizeTag(2) + protowire.SizeBytes(len(r.Key))
	n += protowire.SizeTag(3) + protowire.SizeBytes(len(r.Value))
	if r.OldValue != nil {
		n += protowire.SizeTag(4) + protowire.SizeBytes(len(r.OldValue))
	}
	n += protowire.SizeTag(5) + protowire.SizeVarint(uint64(r.StartTs))
	n += protowire.SizeTag(6) + protowire.SizeVarint(uint64(r.CommitTs))
	return n
}

func protoMessageSize(m *messaging.DMLBatch) int {
	n := protowire.SizeTag(1) + protowire.SizeVarint(uint64(m.Kind()))
	n += protowire.SizeTag(2) + protowire.SizeBytes(16)
	n += protowire.SizeTag(3) + protowire.SizeVarint(uint64(m.Registration))
	n += protowire.SizeTag(4) + protowire.SizeVarint(m.Epoch)
	n += protowire.SizeTag(5) + protowire.SizeVarint(m.Seq)
	n += protowire.SizeTag(6) + 1
	for i := range m.Rows {
		n += protowire.SizeTag(7) + protowire.SizeBytes(protoRowSize(&m.Rows[i]))
	}
	return n
}

func appendProtoFrame(b []byte, m *messaging.DMLBatch) []byte {
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(protoMessageSize(m)))
	b = protowire.AppendTag(b, 1, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(m.Kind()))
	id := m.Dispatcher.Bytes()
	b = protowire.AppendTag(b, 2, protowire.BytesType)
	b = protowire.AppendBytes(b, id[:])
	b = protowire.AppendTag(b, 3, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(m.Registration))
	b = protowire.AppendTag(b, 4, protowire.VarintType)
	b = protowire.AppendVarint(b, m.Epoch)
	b = protowire.AppendTag(b, 5, protowire.VarintType)
	b = protowire.AppendVarint(b, m.Seq)
	b = protowire.AppendTag(b, 6, protowire.VarintType)
	b = protowire.AppendVarint(b, protowire.EncodeBool(m.Partial))
	for i := range m.Rows {
		r := &m.Rows[i]
		b = protowire.AppendTag(b, 7, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(protoRowSize(r)))
		b = protowire.AppendTag(b, 1, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(r.Op))
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendBytes(b, r.Key)
		b = protowire.AppendTag(b, 3, protowire.BytesType)
		b = protowire.AppendBytes(b, r.Value)
		if r.OldValue != nil {
			b = protowire.AppendTag(b, 4, protowire.BytesType)
			b = protowire.AppendBytes(b, r.OldValue)
		}
		b = protowire.AppendTag(b, 5, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(r.StartTs))
		b = protowire.AppendTag(b, 6, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(r.CommitTs))
	}
	return b
}

// decodeProtoFrame decodes what appendProtoFrame wrote (a DMLBatch frame),
// copying byte fields as the wire decoder does.
func decodeProtoFrame(b []byte) (*messaging.DMLBatch, error) {
	bad := fmt.Errorf("%w: bad protobuf frame", ErrMalformed)
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 || num != 1 || typ != protowire.BytesType {
		return nil, bad
	}
	msg, n := protowire.ConsumeBytes(b[n:])
	if n < 0 {
		return nil, bad
	}
	m := &messaging.DMLBatch{}
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return nil, bad
		}
		msg = msg[n:]
		switch typ {
		case protowire.VarintType:
			v, n := protowire.ConsumeVarint(msg)
			if n < 0 {
				return nil, bad
			}
			msg = msg[n:]
			switch num {
			case 3:
				m.Registration = messaging.RegistrationID(v)
			case 4:
				m.Epoch = v
			case 5:
				m.Seq = v
			case 6:
				m.Partial = protowire.DecodeBool(v)
			}
		case protowire.BytesType:
			v, n := protowire.ConsumeBytes(msg)
			if n < 0 {
				return nil, bad
			}
			msg = msg[n:]
			switch num {
			case 2:
				if len(v) != 16 {
					return nil, bad
				}
				m.Dispatcher = common.DispatcherID{Hi: binary.BigEndian.Uint64(v), Lo: binary.BigEndian.Uint64(v[8:])}
			case 7:
				r, err := decodeProtoRow(v)
				if err != nil {
					return nil, err
				}
				m.Rows = append(m.Rows, r)
			}
		default:
			return nil, bad
		}
	}
	return m, nil
}

func decodeProtoRow(b []byte) (common.Row, error) {
	var r common.Row
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return r, ErrMalformed
		}
		b = b[n:]
		if typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return r, ErrMalformed
			}
			b = b[n:]
			switch num {
			case 1:
				r.Op = common.OpType(v)
			case 5:
				r.StartTs = common.Ts(v)
			case 6:
				r.CommitTs = common.Ts(v)
			}
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return r, ErrMalformed
		}
		b = b[n:]
		switch num {
		case 2:
			r.Key = append([]byte(nil), v...)
		case 3:
			r.Value = append([]byte{}, v...)
		case 4:
			r.OldValue = append([]byte{}, v...)
		}
	}
	return r, nil
}

func benchBatch() *messaging.DMLBatch {
	m := &messaging.DMLBatch{Header: messaging.Header{Dispatcher: common.DispatcherID{Hi: 3, Lo: 77}, Registration: 9, Epoch: 2, Seq: 1234}}
	for i := range 64 {
		m.Rows = append(m.Rows, common.Row{Op: common.OpPut, Key: []byte(fmt.Sprintf("key-%08d", i)), Value: make([]byte, 100),
			StartTs: common.Ts(1_700_000_000_000 + i), CommitTs: common.Ts(1_700_000_000_001 + i)})
	}
	return m
}

// Both encodings carry the same batch.
func TestProtobufComparisonDecodesTheSameBatch(t *testing.T) {
	m := benchBatch()
	got, err := decodeProtoFrame(appendProtoFrame(nil, m))
	require.NoError(t, err)
	require.Equal(t, m, got)
	msgs, err := decodeMessages(appendMessages(nil, []messaging.Message{m}))
	require.NoError(t, err)
	require.Equal(t, []messaging.Message{m}, msgs)
}

// BenchmarkEncoding encodes and decodes one 64-row DMLBatch frame with the
// wire encoding and with protobuf's wire format; frame-bytes is the
// encoded size.
func BenchmarkEncoding(b *testing.B) {
	m := benchBatch()
	msgs := []messaging.Message{m}
	b.Run("codec=wire", func(b *testing.B) {
		benchCodec(b, len(m.Rows), func(buf []byte) ([]byte, error) {
			buf = appendMessages(buf, msgs)
			_, err := decodeMessages(buf)
			return buf, err
		})
	})
	b.Run("codec=protobuf", func(b *testing.B) {
		benchCodec(b, len(m.Rows), func(buf []byte) ([]byte, error) {
			buf = appendProtoFrame(buf, m)
			_, err := decodeProtoFrame(buf)
			return buf, err
		})
	})
}

// benchCodec runs roundTrip (encode into buf, decode) b.N times and
// reports the frame's size and the rows per second.
func benchCodec(b *testing.B, rows int, roundTrip func(buf []byte) ([]byte, error)) {
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if buf, err = roundTrip(buf[:0]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(buf)), "frame-bytes")
	b.ReportMetric(float64(rows)*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
}

// BenchmarkDecode decodes what crosses the wire, apart from encoding: a
// data frame of one 64-row DMLBatch, one of 256 resolved-ts messages, and
// the control plane's largest requests (a Register, a heartbeat of 256
// checkpoints).
func BenchmarkDecode(b *testing.B) {
	resolved := make([]messaging.Message, 256)
	checkpoints := make([]messaging.DispatcherCheckpoint, 256)
	for i := range resolved {
		id := common.DispatcherID{Hi: 3, Lo: uint64(i)}
		resolved[i] = &messaging.Resolved{Header: messaging.Header{Dispatcher: id, Registration: 9, Epoch: 2, Seq: 1234}, Ts: 1_700_000_000_000, Slot: uint32(i)}
		checkpoints[i] = messaging.DispatcherCheckpoint{Dispatcher: id, Registration: 9, Epoch: 2, Ts: 1_700_000_000_000, Slot: uint32(i)}
	}
	register := messaging.RegisterRequest{Dispatcher: common.DispatcherID{Hi: 3, Lo: 77}, Registration: 9,
		Span: common.Span{TableID: 42, StartKey: []byte("t42_"), EndKey: []byte("t42`")}, StartTs: 1_700_000_000_000, Target: "collector-1", Slot: 7}
	for _, c := range []struct {
		name   string
		frame  []byte
		decode func([]byte) error
	}{
		{"frame=dml", appendMessages(nil, []messaging.Message{benchBatch()}), func(f []byte) error { _, err := decodeMessages(f); return err }},
		{"frame=resolved", appendMessages(nil, resolved), func(f []byte) error { _, err := decodeMessages(f); return err }},
		{"control=register", appendRegister(nil, register), func(f []byte) error { _, err := decodeControl(f); return err }},
		{"control=heartbeat", appendHeartbeat(nil, messaging.HeartbeatRequest{Checkpoints: checkpoints}),
			func(f []byte) error { _, err := decodeControl(f); return err }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.frame)))
			for b.Loop() {
				if err := c.decode(c.frame); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

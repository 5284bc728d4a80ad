package pgsource

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/cdcflow/eventservice/pkg/common"
)

// A decoder of pgoutput's messages (protocol version 1, with messages),
// written here rather than taken from pglogrepl because the bytes come
// from another process and are hostile until checked: every length is
// checked against the bytes left before anything is allocated, and a
// malformed message is an error, never a panic (FuzzParseMessage).
// pglogrepl's decoders index past the end of a short message and allocate
// whatever a column length claims.

// ErrMalformedMessage wraps every decoding error.
var ErrMalformedMessage = errors.New("pgsource: malformed pgoutput message")

// pgEpoch is PostgreSQL's time zero (2000-01-01 UTC).
var pgEpoch = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

type (
	msgBegin struct {
		finalLSN   uint64
		commitTime time.Time
		xid        uint32
	}
	msgCommit struct {
		commitLSN, endLSN uint64
		commitTime        time.Time
	}
	relColumn struct {
		key     bool
		name    string
		typeOID uint32
		typeMod int32
	}
	msgRelation struct {
		oid             uint32
		namespace, name string
		replicaIdentity byte
		columns         []relColumn
	}
	// tupleCol is one column of a tuple: kind 'n', 'u', 't' (or 'b').
	tupleCol struct {
		kind byte
		data []byte // aliases the message
	}
	msgInsert struct {
		rel uint32
		new []tupleCol
	}
	msgUpdate struct {
		rel     uint32
		oldKind byte // 0, 'K' or 'O'
		old     []tupleCol
		new     []tupleCol
	}
	msgDelete struct {
		rel     uint32
		oldKind byte // 'K' or 'O'
		old     []tupleCol
	}
	msgTruncate struct {
		cascade, restartIdentity bool
		rels                     []uint32
	}
	msgMessage struct {
		transactional bool
		lsn           uint64
		prefix        string
		content       []byte
	}
	msgIgnored struct{ kind byte } // origin, type
)

type reader struct {
	b   []byte
	err error
}

func (r *reader) fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", ErrMalformedMessage, what)
	}
	r.b = nil
}

func (r *reader) need(n int, what string) bool {
	if r.err != nil {
		return false
	}
	if len(r.b) < n {
		r.fail("short " + what)
		return false
	}
	return true
}

func (r *reader) u8(what string) byte {
	if !r.need(1, what) {
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *reader) u16(what string) uint16 {
	if !r.need(2, what) {
		return 0
	}
	v := binary.BigEndian.Uint16(r.b)
	r.b = r.b[2:]
	return v
}

func (r *reader) u32(what string) uint32 {
	if !r.need(4, what) {
		return 0
	}
	v := binary.BigEndian.Uint32(r.b)
	r.b = r.b[4:]
	return v
}

func (r *reader) u64(what string) uint64 {
	if !r.need(8, what) {
		return 0
	}
	v := binary.BigEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

// A commit time is microseconds since 2000-01-01. One before the Unix
// epoch or past what a Ts can hold (2^46 ms after it, the year 4199)
// would wrap the commit-ts it becomes, so it is refused.
const (
	minCommitMicros = -946_684_800_000_000                                      // 1970-01-01
	maxCommitMicros = (1<<(64-common.LogicalBits) - 1 - 946_684_800_000) * 1000 // the largest Ts's millisecond
)

func (r *reader) time(what string) time.Time {
	us := int64(r.u64(what))
	if r.err == nil && (us < minCommitMicros || us > maxCommitMicros) {
		r.fail(what + " out of range")
		return time.Time{}
	}
	// Microseconds since the Unix epoch: past about 292 years from
	// 2000 a time.Duration could not hold them.
	return time.UnixMicro(us - minCommitMicros).UTC()
}

// cstring reads a NUL-terminated string.
func (r *reader) cstring(what string) string {
	if r.err != nil {
		return ""
	}
	for i, c := range r.b {
		if c == 0 {
			s := string(r.b[:i])
			r.b = r.b[i+1:]
			return s
		}
	}
	r.fail("unterminated " + what)
	return ""
}

// tuple reads a TupleData: a column count, then per column a kind and,
// for text and binary, a length and the bytes.
func (r *reader) tuple() []tupleCol {
	n := int(r.u16("tuple column count"))
	if r.err != nil {
		return nil
	}
	if n > len(r.b) { // each column takes at least its kind byte
		r.fail(fmt.Sprintf("%d columns in %d bytes", n, len(r.b)))
		return nil
	}
	cols := make([]tupleCol, n)
	for i := range cols {
		c := &cols[i]
		c.kind = r.u8("column kind")
		switch c.kind {
		case 'n', 'u':
		case 't', 'b':
			l := r.u32("column length")
			if r.err == nil && uint64(l) > uint64(len(r.b)) {
				r.fail(fmt.Sprintf("column of %d bytes in %d", l, len(r.b)))
			}
			if r.err != nil {
				return nil
			}
			c.data = r.b[:l:l]
			r.b = r.b[l:]
		default:
			r.fail(fmt.Sprintf("column kind %q", c.kind))
		}
		if r.err != nil {
			return nil
		}
	}
	return cols
}

func (r *reader) end(what string) error {
	if r.err == nil && len(r.b) != 0 {
		r.fail(fmt.Sprintf("%d bytes after a %s", len(r.b), what))
	}
	return r.err
}

// parseMessage decodes one pgoutput message (the data of an XLogData).
func parseMessage(b []byte) (any, error) {
	r := &reader{b: b}
	kind := r.u8("message type")
	if r.err != nil {
		return nil, r.err
	}
	switch kind {
	case 'B':
		m := msgBegin{finalLSN: r.u64("begin LSN"), commitTime: r.time("begin time"), xid: r.u32("xid")}
		return m, r.end("begin")
	case 'C':
		r.u8("commit flags")
		m := msgCommit{commitLSN: r.u64("commit LSN"), endLSN: r.u64("end LSN"), commitTime: r.time("commit time")}
		return m, r.end("commit")
	case 'R':
		m := msgRelation{oid: r.u32("relation id"), namespace: r.cstring("namespace"), name: r.cstring("relation name"),
			replicaIdentity: r.u8("replica identity")}
		n := int(r.u16("column count"))
		if r.err == nil && n > len(r.b)/10 { // flags, a NUL, type and modifier: 10 bytes at least
			r.fail(fmt.Sprintf("%d columns in %d bytes", n, len(r.b)))
		}
		if r.err != nil {
			return nil, r.err
		}
		m.columns = make([]relColumn, n)
		for i := range m.columns {
			c := &m.columns[i]
			c.key = r.u8("column flags")&1 != 0
			c.name = r.cstring("column name")
			c.typeOID = r.u32("column type")
			c.typeMod = int32(r.u32("column type modifier"))
		}
		return m, r.end("relation")
	case 'I':
		m := msgInsert{rel: r.u32("relation id")}
		if t := r.u8("tuple type"); r.err == nil && t != 'N' {
			r.fail(fmt.Sprintf("insert tuple type %q", t))
		}
		m.new = r.tuple()
		return m, r.end("insert")
	case 'U':
		m := msgUpdate{rel: r.u32("relation id")}
		t := r.u8("tuple type")
		if t == 'K' || t == 'O' {
			m.oldKind = t
			m.old = r.tuple()
			t = r.u8("tuple type")
		}
		if r.err == nil && t != 'N' {
			r.fail(fmt.Sprintf("update tuple type %q", t))
		}
		m.new = r.tuple()
		return m, r.end("update")
	case 'D':
		m := msgDelete{rel: r.u32("relation id"), oldKind: r.u8("tuple type")}
		if r.err == nil && m.oldKind != 'K' && m.oldKind != 'O' {
			r.fail(fmt.Sprintf("delete tuple type %q", m.oldKind))
		}
		m.old = r.tuple()
		return m, r.end("delete")
	case 'T':
		n := r.u32("relation count")
		opts := r.u8("truncate options")
		if r.err == nil && uint64(n) > uint64(len(r.b)/4) {
			r.fail(fmt.Sprintf("%d relations in %d bytes", n, len(r.b)))
		}
		if r.err != nil {
			return nil, r.err
		}
		m := msgTruncate{cascade: opts&1 != 0, restartIdentity: opts&2 != 0, rels: make([]uint32, n)}
		for i := range m.rels {
			m.rels[i] = r.u32("relation id")
		}
		return m, r.end("truncate")
	case 'M':
		m := msgMessage{transactional: r.u8("message flags")&1 != 0, lsn: r.u64("message LSN"), prefix: r.cstring("message prefix")}
		l := r.u32("message length")
		if r.err == nil && uint64(l) != uint64(len(r.b)) {
			r.fail(fmt.Sprintf("message of %d bytes in %d", l, len(r.b)))
		}
		if r.err != nil {
			return nil, r.err
		}
		m.content = r.b
		return m, nil
	case 'O', 'Y':
		return msgIgnored{kind: kind}, nil
	}
	return nil, fmt.Errorf("%w: message type %q", ErrMalformedMessage, kind)
}

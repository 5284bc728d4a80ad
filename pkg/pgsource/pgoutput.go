package pgsource

import (
	"fmt"
	"time"

	"github.com/cdcflow/eventservice/internal/wirereader"
	"github.com/cdcflow/eventservice/pkg/common"
)

// A decoder of pgoutput's messages (protocol version 1, with messages),
// written here rather than taken from pglogrepl because the bytes come
// from another process and are hostile until checked: every length is
// checked against the bytes left before anything is allocated, and a
// malformed message is an error, never a panic (FuzzParseMessage).
// pglogrepl's decoders index past the end of a short message and allocate
// whatever a column length claims.

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

// reader reads a message: wirereader's reads, and pgoutput's own.
type reader struct{ wirereader.Reader }

// A commit time is microseconds since 2000-01-01. One before the Unix
// epoch or past what a Ts can hold (2^46 ms after it, the year 4199)
// would wrap the commit-ts it becomes, so it is refused.
const (
	minCommitMicros = -946_684_800_000_000                                      // 1970-01-01
	maxCommitMicros = (1<<(64-common.LogicalBits) - 1 - 946_684_800_000) * 1000 // the largest Ts's millisecond
)

func (r *reader) time(what string) time.Time {
	us := int64(r.U64(what))
	if r.Err() == nil && (us < minCommitMicros || us > maxCommitMicros) {
		r.Fail(what + " out of range")
		return time.Time{}
	}
	// Microseconds since the Unix epoch: past about 292 years from
	// 2000 a time.Duration could not hold them.
	return time.UnixMicro(us - minCommitMicros).UTC()
}

// tuple reads a TupleData: a column count, then per column a kind and,
// for text and binary, a length and the bytes.
func (r *reader) tuple() []tupleCol {
	// Each column takes at least its kind byte.
	n := r.Count(uint64(r.U16("tuple column count")), 1, "columns")
	if r.Err() != nil {
		return nil
	}
	cols := make([]tupleCol, n)
	for i := range cols {
		c := &cols[i]
		c.kind = r.U8("column kind")
		switch c.kind {
		case 'n', 'u':
		case 't', 'b':
			c.data = r.Bytes(uint64(r.U32("column length")), "column")
		default:
			r.Failf("column kind %q", c.kind)
		}
		if r.Err() != nil {
			return nil
		}
	}
	return cols
}

// parseMessage decodes one pgoutput message (the data of an XLogData).
func parseMessage(b []byte) (any, error) {
	r := &reader{wirereader.New(b, ErrMalformedMessage)}
	kind := r.U8("message type")
	if err := r.Err(); err != nil {
		return nil, err
	}
	switch kind {
	case 'B':
		m := msgBegin{finalLSN: r.U64("begin LSN"), commitTime: r.time("begin time"), xid: r.U32("xid")}
		return m, r.End("a begin")
	case 'C':
		r.U8("commit flags")
		m := msgCommit{commitLSN: r.U64("commit LSN"), endLSN: r.U64("end LSN"), commitTime: r.time("commit time")}
		return m, r.End("a commit")
	case 'R':
		m := msgRelation{oid: r.U32("relation id"), namespace: r.CString("namespace"), name: r.CString("relation name"),
			replicaIdentity: r.U8("replica identity")}
		// flags, a NUL, type and modifier: 10 bytes at least
		n := r.Count(uint64(r.U16("column count")), 10, "columns")
		if err := r.Err(); err != nil {
			return nil, err
		}
		m.columns = make([]relColumn, n)
		for i := range m.columns {
			c := &m.columns[i]
			c.key = r.U8("column flags")&1 != 0
			c.name = r.CString("column name")
			c.typeOID = r.U32("column type")
			c.typeMod = int32(r.U32("column type modifier"))
		}
		return m, r.End("a relation")
	case 'I':
		m := msgInsert{rel: r.U32("relation id")}
		if t := r.U8("tuple type"); r.Err() == nil && t != 'N' {
			r.Failf("insert tuple type %q", t)
		}
		m.new = r.tuple()
		return m, r.End("an insert")
	case 'U':
		m := msgUpdate{rel: r.U32("relation id")}
		t := r.U8("tuple type")
		if t == 'K' || t == 'O' {
			m.oldKind = t
			m.old = r.tuple()
			t = r.U8("tuple type")
		}
		if r.Err() == nil && t != 'N' {
			r.Failf("update tuple type %q", t)
		}
		m.new = r.tuple()
		return m, r.End("an update")
	case 'D':
		m := msgDelete{rel: r.U32("relation id"), oldKind: r.U8("tuple type")}
		if r.Err() == nil && m.oldKind != 'K' && m.oldKind != 'O' {
			r.Failf("delete tuple type %q", m.oldKind)
		}
		m.old = r.tuple()
		return m, r.End("a delete")
	case 'T':
		n := r.U32("relation count")
		opts := r.U8("truncate options")
		rels := r.Count(uint64(n), 4, "relations")
		if err := r.Err(); err != nil {
			return nil, err
		}
		m := msgTruncate{cascade: opts&1 != 0, restartIdentity: opts&2 != 0, rels: make([]uint32, rels)}
		for i := range m.rels {
			m.rels[i] = r.U32("relation id")
		}
		return m, r.End("a truncate")
	case 'M':
		m := msgMessage{transactional: r.U8("message flags")&1 != 0, lsn: r.U64("message LSN"), prefix: r.CString("message prefix")}
		l := r.U32("message length")
		if r.Err() == nil && uint64(l) != uint64(r.Len()) {
			r.Failf("message of %d bytes in %d", l, r.Len())
		}
		if err := r.Err(); err != nil {
			return nil, err
		}
		m.content = r.Rest()
		return m, nil
	case 'O', 'Y':
		return msgIgnored{kind: kind}, nil
	}
	return nil, fmt.Errorf("%w: message type %q", ErrMalformedMessage, kind)
}

package wirereader

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// Reader reads a []byte front to back. Make one with New; the zero value
// reads nothing and fails with a nil sentinel. Not safe for concurrent
// use.
//
// INVARIANT: err != nil implies len(b) == 0.
type Reader struct {
	b        []byte
	err      error
	sentinel error
}

// New returns a Reader of b whose errors wrap sentinel. It keeps b:
// Bytes returns sub-slices of it.
func New(b []byte, sentinel error) Reader { return Reader{b: b, sentinel: sentinel} }

// Err returns the first error, or nil.
func (r *Reader) Err() error { return r.err }

// Len returns the number of bytes left.
func (r *Reader) Len() int { return len(r.b) }

// Rest returns the bytes left without reading them (a sub-slice of the
// input).
func (r *Reader) Rest() []byte { return r.b }

// Fail records "sentinel: what" unless an error is recorded already, and
// drops the bytes left.
func (r *Reader) Fail(what string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", r.sentinel, what)
	}
	r.b = nil
}

// Failf is Fail with a formatted message.
func (r *Reader) Failf(format string, args ...any) {
	if r.err == nil {
		r.Fail(fmt.Sprintf(format, args...))
	}
	r.b = nil
}

// FailWith records err itself (an error of the format's own, which need
// not wrap the sentinel) unless an error is recorded already, and drops
// the bytes left.
func (r *Reader) FailWith(err error) {
	if r.err == nil {
		r.err = err
	}
	r.b = nil
}

// short fails a fixed-size read of what (formatting nothing after an
// error: a decoder goes on reading to its end).
func (r *Reader) short(what string) {
	if r.err == nil {
		r.Fail("short " + what)
	}
}

// U8 reads a byte.
func (r *Reader) U8(what string) byte {
	if len(r.b) < 1 {
		r.short(what)
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

// U16 reads a big-endian uint16.
func (r *Reader) U16(what string) uint16 {
	if len(r.b) < 2 {
		r.short(what)
		return 0
	}
	v := binary.BigEndian.Uint16(r.b)
	r.b = r.b[2:]
	return v
}

// U32 reads a big-endian uint32.
func (r *Reader) U32(what string) uint32 {
	if len(r.b) < 4 {
		r.short(what)
		return 0
	}
	v := binary.BigEndian.Uint32(r.b)
	r.b = r.b[4:]
	return v
}

// U64 reads a big-endian uint64.
func (r *Reader) U64(what string) uint64 {
	if len(r.b) < 8 {
		r.short(what)
		return 0
	}
	v := binary.BigEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

// Uvarint reads an unsigned varint (binary.AppendUvarint's): one that is
// cut short or overflows 64 bits fails.
func (r *Reader) Uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.Fail("bad uvarint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

// Varint reads a signed varint (binary.AppendVarint's).
func (r *Reader) Varint() int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.Fail("bad varint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

// Bytes reads n bytes: a sub-slice of the input, capped at n. It fails
// ("what of n bytes in m") if fewer than n are left; after an error it
// returns nil.
func (r *Reader) Bytes(n uint64, what string) []byte {
	if n > uint64(len(r.b)) {
		r.past(n, what)
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

// String reads n bytes as a string (a copy).
func (r *Reader) String(n uint64, what string) string {
	if n > uint64(len(r.b)) {
		r.past(n, what)
		return ""
	}
	v := string(r.b[:n])
	r.b = r.b[n:]
	return v
}

// past fails a read of n bytes of what that the input does not hold.
func (r *Reader) past(n uint64, what string) {
	if r.err == nil {
		r.Failf("%s of %d bytes in %d", what, n, len(r.b))
	}
	r.b = nil
}

// CString reads a NUL-terminated string (a copy, without its NUL).
func (r *Reader) CString(what string) string {
	i := bytes.IndexByte(r.b, 0)
	if i < 0 {
		if r.err == nil {
			r.Fail("unterminated " + what)
		}
		return ""
	}
	v := string(r.b[:i])
	r.b = r.b[i+1:]
	return v
}

// Count checks a count n of elements that take at least minBytes each
// (a minBytes below 1 counts as 1) against the bytes left, and returns it as an int: it
// fails ("n what in m bytes") and returns 0 when they could not hold n
// elements, so that nothing is allocated for a count the input does not
// back. After an error it returns 0.
func (r *Reader) Count(n uint64, minBytes int, what string) int {
	if n > uint64(len(r.b)/max(minBytes, 1)) {
		if r.err == nil {
			r.Failf("%d %s in %d bytes", n, what, len(r.b))
		}
		r.b = nil
		return 0
	}
	return int(n)
}

// End returns the first error, after failing ("m bytes after what") if
// any byte is left.
func (r *Reader) End(after string) error {
	if r.err == nil && len(r.b) != 0 {
		r.Failf("%d bytes after %s", len(r.b), after)
	}
	return r.err
}

package wirereader

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var errBad = errors.New("test: malformed")

// Every kind of read, in order, of what an encoder wrote.
func TestReadsWhatWasWritten(t *testing.T) {
	var b []byte
	b = append(b, 7)
	b = binary.BigEndian.AppendUint16(b, 0xbeef)
	b = binary.BigEndian.AppendUint32(b, 0xdeadbeef)
	b = binary.BigEndian.AppendUint64(b, math.MaxUint64-1)
	b = binary.AppendUvarint(b, 300)
	b = binary.AppendVarint(b, -300)
	b = append(b, "abc"...)
	b = append(b, "xyz"...)
	b = append(b, "name\x00"...)
	b = binary.AppendUvarint(b, 2)
	b = append(b, 1, 2)

	r := New(b, errBad)
	require.Equal(t, byte(7), r.U8("a"))
	require.Equal(t, uint16(0xbeef), r.U16("b"))
	require.Equal(t, uint32(0xdeadbeef), r.U32("c"))
	require.Equal(t, uint64(math.MaxUint64-1), r.U64("d"))
	require.Equal(t, uint64(300), r.Uvarint())
	require.Equal(t, int64(-300), r.Varint())
	got := r.Bytes(3, "e")
	require.Equal(t, []byte("abc"), got)
	require.Equal(t, 3, cap(got), "capped: an append cannot reach the next bytes")
	require.Equal(t, "xyz", r.String(3, "f"))
	require.Equal(t, "name", r.CString("g"))
	n := r.Count(r.Uvarint(), 1, "elements")
	require.Equal(t, 2, n)
	require.Equal(t, 2, r.Len())
	require.Equal(t, []byte{1, 2}, r.Rest())
	require.EqualError(t, r.End("the elements' count"), "test: malformed: 2 bytes after the elements' count")
	require.Zero(t, r.Len(), "an error drops the bytes left")
}

// Each read past the end fails with its own message, wrapping the
// sentinel; the first error sticks and later reads return zero values.
func TestFailures(t *testing.T) {
	for _, c := range []struct {
		in   []byte
		read func(r *Reader)
		want string
	}{
		{nil, func(r *Reader) { r.U8("kind") }, "short kind"},
		{[]byte{1}, func(r *Reader) { r.U16("count") }, "short count"},
		{[]byte{1, 2, 3}, func(r *Reader) { r.U32("oid") }, "short oid"},
		{make([]byte, 7), func(r *Reader) { r.U64("lsn") }, "short lsn"},
		{[]byte{0x80}, func(r *Reader) { r.Uvarint() }, "bad uvarint"},
		{[]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1}, func(r *Reader) { r.Uvarint() }, "bad uvarint"},
		{[]byte{0x80}, func(r *Reader) { r.Varint() }, "bad varint"},
		{[]byte("ab"), func(r *Reader) { r.Bytes(3, "column") }, "column of 3 bytes in 2"},
		{[]byte("ab"), func(r *Reader) { r.Bytes(math.MaxUint64, "column") }, fmt.Sprintf("column of %d bytes in 2", uint64(math.MaxUint64))},
		{[]byte("ab"), func(r *Reader) { r.String(3, "query") }, "query of 3 bytes in 2"},
		{[]byte("ab"), func(r *Reader) { r.CString("namespace") }, "unterminated namespace"},
		{[]byte("abcd"), func(r *Reader) { r.Count(3, 2, "columns") }, "3 columns in 4 bytes"},
		{[]byte("abcd"), func(r *Reader) { r.Count(1<<40, 1, "rows") }, "1099511627776 rows in 4 bytes"},
		{[]byte("ab"), func(r *Reader) { r.Fail("bad kind") }, "bad kind"},
		{[]byte("ab"), func(r *Reader) { r.Failf("kind %q", 'x') }, "kind 'x'"},
	} {
		r := New(c.in, errBad)
		c.read(&r)
		err := r.Err()
		require.ErrorIs(t, err, errBad, c.want)
		require.EqualError(t, err, "test: malformed: "+c.want)
		require.Zero(t, r.Len(), "%s: the bytes left are dropped", c.want)
		// Sticky: nothing later replaces it, every read is zero.
		require.Zero(t, r.U8("x"))
		require.Zero(t, r.U64("x"))
		require.Zero(t, r.Uvarint())
		require.Nil(t, r.Bytes(0, "x"))
		require.Empty(t, r.String(0, "x"))
		require.Empty(t, r.CString("x"))
		require.Zero(t, r.Count(1, 1, "x"))
		r.Fail("later")
		r.FailWith(errors.New("later"))
		require.Same(t, err, r.Err())
		require.Same(t, err, r.End("x"))
	}
}

// FailWith records an error of the format's own as it is.
func TestFailWith(t *testing.T) {
	version := errors.New("version mismatch")
	r := New([]byte("abc"), errBad)
	r.FailWith(version)
	require.Same(t, version, r.Err())
	require.Zero(t, r.Len())
	require.NotErrorIs(t, r.Err(), errBad)
}

// A count is checked against the fewest bytes an element takes; a
// minimum below 1 counts as 1 (no division by zero).
func TestCount(t *testing.T) {
	r := New(make([]byte, 10), errBad)
	require.Equal(t, 5, r.Count(5, 2, "x"))
	require.Equal(t, 10, r.Count(10, 0, "x"))
	require.Equal(t, 10, r.Count(10, -3, "x"))
	require.NoError(t, r.Err())
	require.Zero(t, r.Count(6, 2, "x"))
	require.Error(t, r.Err())
}

// A successful read allocates nothing but the strings it returns.
func TestReadsDoNotAllocate(t *testing.T) {
	b := binary.BigEndian.AppendUint64([]byte{1, 0, 2, 0, 0, 0, 3}, 4)
	b = binary.AppendUvarint(b, 1<<40)
	b = binary.AppendVarint(b, -1<<40)
	b = append(b, "bytes"...)
	allocs := testing.AllocsPerRun(100, func() {
		r := New(b, errBad)
		r.U8("a")
		r.U16("b")
		r.U32("c")
		r.U64("d")
		r.Uvarint()
		r.Varint()
		r.Count(5, 1, "bytes")
		r.Bytes(5, "e")
		if r.End("the end") != nil {
			panic("decoded wrong")
		}
	})
	require.Zero(t, allocs)
}

// FuzzReader runs the reads ops names on data and checks each against a
// naive model of the same read (an offset into data and a failed flag):
// the values, what is consumed, that nothing panics, that an error wraps
// the sentinel and sticks, and that Bytes aliases the input capped.
func FuzzReader(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, []byte("\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x00tail"))
	f.Add([]byte{6, 3, 7, 2, 8, 9, 1, 4}, binary.AppendUvarint(nil, 1<<40))
	f.Add([]byte{4, 4, 4, 9, 0}, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, ops, data []byte) {
		r := New(data, errBad)
		off, failed := 0, false
		left := func() int {
			if failed {
				return 0
			}
			return len(data) - off
		}
		// take models a read of n bytes: ok and the bytes, or failure.
		take := func(n uint64) ([]byte, bool) {
			if failed || n > uint64(len(data)-off) {
				failed = true
				return nil, false
			}
			v := data[off : off+int(n)]
			off += int(n)
			return v, true
		}
		var firstErr error
		for i := 0; i < len(ops); i++ {
			op := ops[i]
			arg := uint64(0)
			if i+1 < len(ops) {
				arg = uint64(ops[i+1])
			}
			switch op % 10 {
			case 0:
				v, ok := take(1)
				got := r.U8("u8")
				if ok {
					require.Equal(t, v[0], got)
				} else {
					require.Zero(t, got)
				}
			case 1:
				v, ok := take(2)
				got := r.U16("u16")
				if ok {
					require.Equal(t, binary.BigEndian.Uint16(v), got)
				} else {
					require.Zero(t, got)
				}
			case 2:
				v, ok := take(4)
				got := r.U32("u32")
				if ok {
					require.Equal(t, binary.BigEndian.Uint32(v), got)
				} else {
					require.Zero(t, got)
				}
			case 3:
				v, ok := take(8)
				got := r.U64("u64")
				if ok {
					require.Equal(t, binary.BigEndian.Uint64(v), got)
				} else {
					require.Zero(t, got)
				}
			case 4, 5:
				want, n := uint64(0), 0
				if !failed {
					want, n = binary.Uvarint(data[off:])
				}
				var got uint64
				if op%10 == 4 {
					got = r.Uvarint()
				} else {
					var s int64
					var sn int
					if !failed {
						s, sn = binary.Varint(data[off:])
					}
					want, n = uint64(s), sn
					got = uint64(r.Varint())
				}
				if n > 0 {
					off += n
					require.Equal(t, want, got)
				} else {
					failed = true
					require.Zero(t, got)
				}
			case 6:
				i++
				v, ok := take(arg)
				got := r.Bytes(arg, "bytes")
				if ok {
					require.Equal(t, v, got)
					require.Equal(t, len(got), cap(got), "capped")
					if len(got) > 0 {
						require.Same(t, &v[0], &got[0], "a sub-slice of the input")
					}
				} else {
					require.Nil(t, got)
				}
			case 7:
				i++
				v, ok := take(arg)
				got := r.String(arg, "string")
				if ok {
					require.Equal(t, string(v), got)
				} else {
					require.Empty(t, got)
				}
			case 8:
				want, ok := "", false
				if !failed {
					for j := off; j < len(data); j++ {
						if data[j] == 0 {
							want, ok = string(data[off:j]), true
							off = j + 1
							break
						}
					}
				}
				failed = failed || !ok
				got := r.CString("cstring")
				require.Equal(t, want, got)
			case 9:
				i++
				n, minBytes := arg*arg*arg, int(op/10)
				ok := !failed && n*uint64(max(minBytes, 1)) <= uint64(len(data)-off)
				got := r.Count(n, minBytes, "elements")
				if ok {
					require.Equal(t, int(n), got)
				} else {
					failed = true
					require.Zero(t, got)
				}
			}
			require.Equal(t, left(), r.Len(), "after op %d", i)
			require.Equal(t, failed, r.Err() != nil, "after op %d", i)
			if err := r.Err(); err != nil {
				require.ErrorIs(t, err, errBad)
				if firstErr == nil {
					firstErr = err
				}
				require.Same(t, firstErr, err, "the first error sticks")
			}
		}
		err := r.End("the ops")
		if failed || left() != 0 {
			require.ErrorIs(t, err, errBad)
		} else {
			require.NoError(t, err)
		}
	})
}

package eventstore

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
)

func TestCodecRoundTrip(t *testing.T) {
	row := common.Row{Op: common.OpPut, Key: []byte("k1"), Value: []byte("value"), OldValue: []byte("old"), StartTs: 5, CommitTs: 9}
	key := make([]byte, encodedKeyLen(row.Key))
	encodeKey(key, 42, row.CommitTs, row.StartTs, row.Key)
	require.Equal(t, key, appendKey(nil, 42, row.CommitTs, row.StartTs, row.Key))
	val := make([]byte, encodedValueLen(&row))
	encodeValue(val, &row)

	sub, c, s, k, err := decodeKey(key)
	require.NoError(t, err)
	require.Equal(t, uint64(42), sub)
	require.Equal(t, row.CommitTs, c)
	require.Equal(t, row.StartTs, s)
	require.Equal(t, row.Key, k)
	var got common.Row
	require.NoError(t, decodeValue(val, &got))
	require.Equal(t, row.Op, got.Op)
	require.Equal(t, row.Value, got.Value)
	require.Equal(t, row.OldValue, got.OldValue)
}

func TestCodecRejectsCorrupt(t *testing.T) {
	_, _, _, _, err := decodeKey([]byte{1, 2, 3})
	require.True(t, errors.Is(err, ErrCorrupt))
	var r common.Row
	for _, v := range [][]byte{nil, {1}, {9, 1, 0}, {1, 7, 0}, {1, 1, 5, 'a'}, {1, 1, 0xff}} {
		require.ErrorIs(t, decodeValue(v, &r), ErrCorrupt, "value %x", v)
	}
}

func TestBoundariesBracketCommitTs(t *testing.T) {
	k := appendKey(nil, 7, 100, 90, []byte("x"))
	require.Negative(t, bytes.Compare(tsBoundary(7, 100), k))
	require.Positive(t, bytes.Compare(tsBoundary(7, 101), k))
	require.Negative(t, bytes.Compare(subBoundary(7), k))
	require.Positive(t, bytes.Compare(subBoundary(8), k))
}

// FuzzKeyCodec checks that keys round-trip and that byte order of encoded
// keys equals the (sub, commit-ts, start-ts, row key) tuple order.
func FuzzKeyCodec(f *testing.F) {
	f.Add(uint64(1), uint64(10), uint64(5), []byte("a"), uint64(1), uint64(10), uint64(6), []byte(""))
	f.Add(uint64(1), uint64(10), uint64(5), []byte("ab"), uint64(1), uint64(10), uint64(5), []byte("a\xff"))
	f.Add(uint64(2), uint64(0), uint64(0), []byte{0}, uint64(1), uint64(1<<63), uint64(3), []byte{})
	f.Fuzz(func(t *testing.T, s1, c1, st1 uint64, k1 []byte, s2, c2, st2 uint64, k2 []byte) {
		a := appendKey(nil, s1, common.Ts(c1), common.Ts(st1), k1)
		b := appendKey(nil, s2, common.Ts(c2), common.Ts(st2), k2)
		sub, c, st, k, err := decodeKey(a)
		if err != nil || sub != s1 || uint64(c) != c1 || uint64(st) != st1 || !bytes.Equal(k, k1) {
			t.Fatalf("round trip failed: %v %d %d %d %x", err, sub, c, st, k)
		}
		want := cmpTuple(s1, c1, st1, k1, s2, c2, st2, k2)
		if got := bytes.Compare(a, b); got != want {
			t.Fatalf("order mismatch: bytes %d tuple %d", got, want)
		}
		row := common.Row{Op: common.OpDelete, Key: k1, Value: k2, OldValue: k1}
		v := make([]byte, encodedValueLen(&row))
		encodeValue(v, &row)
		var back common.Row
		if err := decodeValue(v, &back); err != nil || !bytes.Equal(back.Value, k2) || !bytes.Equal(back.OldValue, k1) || back.Op != row.Op {
			t.Fatalf("value round trip failed: %v", err)
		}
	})
}

func cmpTuple(s1, c1, st1 uint64, k1 []byte, s2, c2, st2 uint64, k2 []byte) int {
	for _, p := range [][2]uint64{{s1, s2}, {c1, c2}, {st1, st2}} {
		if p[0] < p[1] {
			return -1
		}
		if p[0] > p[1] {
			return 1
		}
	}
	return bytes.Compare(k1, k2)
}

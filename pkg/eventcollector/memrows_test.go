package eventcollector

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
)

// TestArenaRowsReadBackExactly: rows read back from the arena equal the
// rows applied, nil and empty slices kept apart, a row larger than a chunk
// included; appending to a row read back does not write into the arena;
// and the caller's memory is not kept (changing it later changes nothing).
func TestArenaRowsReadBackExactly(t *testing.T) {
	big := bytes.Repeat([]byte{7}, arenaChunkBytes+10)
	rows := []common.Row{
		{Op: common.OpPut, Key: []byte("k1"), Value: []byte("v1"), StartTs: 1, CommitTs: 2},
		{Op: common.OpDelete, Key: []byte("k2"), Value: nil, OldValue: []byte{}, StartTs: 3, CommitTs: 4},
		{Op: common.OpPut, Key: []byte{}, Value: []byte{}, OldValue: nil, StartTs: 5, CommitTs: 6},
		{Op: common.OpPut, Key: []byte("huge"), Value: big, StartTs: 7, CommitTs: 8},
		{Op: common.OpPut, Key: []byte("after"), Value: []byte("v"), OldValue: []byte("old"), StartTs: 9, CommitTs: 10},
	}
	var a rowArena
	refs := a.add(rows)
	got := a.appendRows(nil, []refRange{refs})
	require.Equal(t, len(rows), len(got))
	for i := range rows {
		require.Equal(t, rows[i], got[i], "row %d (DeepEqual: nil and empty differ)", i)
		require.Equal(t, rows[i].Value == nil, got[i].Value == nil, "row %d: nil value stays nil", i)
		require.Equal(t, rows[i].OldValue == nil, got[i].OldValue == nil, "row %d: nil old value stays nil", i)
	}
	require.GreaterOrEqual(t, len(a.chunks), 2, "the huge row has a chunk of its own")

	_ = append(got[0].Key, 'X') // a reader's append copies: capped
	rows[4].Key[0] = 'Z'        // the caller's memory is not kept
	again := a.appendRows(nil, []refRange{refs})
	require.Equal(t, []byte("k1"), again[0].Key)
	require.Equal(t, []byte("v1"), again[0].Value, "the next field is not overwritten by a reader's append")
	require.Equal(t, []byte("after"), again[4].Key)
}

// TestArenaHoldsNoPointers: a rowRef has no field the GC must trace, and
// the arena's chunks are byte slices, so a sink's retained rows cost a
// mark phase nothing per row (the reason for the arena).
func TestArenaHoldsNoPointers(t *testing.T) {
	rt := reflect.TypeOf(rowRef{})
	for i := range rt.NumField() {
		switch k := rt.Field(i).Type.Kind(); k {
		case reflect.Pointer, reflect.Slice, reflect.Map, reflect.String, reflect.Interface, reflect.Func,
			reflect.Chan, reflect.UnsafePointer, reflect.Struct, reflect.Array:
			t.Fatalf("rowRef.%s is a %v", rt.Field(i).Name, k)
		}
	}
	rr := reflect.TypeOf(refRange{})
	for i := range rr.NumField() {
		require.Equal(t, reflect.Uint32, rr.Field(i).Type.Kind(), "refRange.%s", rr.Field(i).Name)
	}
	require.Equal(t, reflect.Uint8, reflect.TypeOf(rowArena{}.chunks).Elem().Elem().Kind())
}

// TestArenaBatchesCrossRefChunks: a batch that does not fit in what is left
// of a chunk of references starts the next one, whole, and every batch
// reads back as applied.
func TestArenaBatchesCrossRefChunks(t *testing.T) {
	var a rowArena
	mk := func(n int, tag byte) []common.Row {
		rows := make([]common.Row, n)
		for i := range rows {
			rows[i] = common.Row{Op: common.OpPut, Key: []byte{tag, byte(i), byte(i >> 8)}, Value: []byte{tag}, StartTs: 1, CommitTs: common.Ts(i + 2)}
		}
		return rows
	}
	first, second, third := mk(refChunkRows-1, 'a'), mk(2, 'b'), mk(refChunkRows+3, 'c')
	r1, r2, r3 := a.add(first), a.add(second), a.add(third)
	require.Equal(t, refRange{chunk: 0, off: 0, n: refChunkRows - 1}, r1)
	require.Equal(t, refRange{chunk: 1, off: 0, n: 2}, r2, "two rows do not fit in the one left: the next chunk, whole")
	require.Equal(t, refRange{chunk: 2, off: 0, n: refChunkRows + 3}, r3, "a batch larger than a chunk gets its own")
	got := a.appendRows(nil, []refRange{r1, r2, r3})
	require.Equal(t, append(append(first, second...), third...), got)
}

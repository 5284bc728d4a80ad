package common

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestPackedSpanKeepsTheSpan: a whole table packs without keys (nil and
// empty keys alike) and contains every key; a narrower span gets its keys
// back and contains what the span contains; the packed form is 16 bytes.
func TestPackedSpanKeepsTheSpan(t *testing.T) {
	for _, s := range []Span{
		TableSpan(7),
		{TableID: 7, StartKey: []byte{}, EndKey: []byte{}},
		{TableID: 7, StartKey: []byte("b"), EndKey: []byte("d")},
		{TableID: 7, EndKey: []byte("c")},
		{TableID: 7, StartKey: []byte("c")},
	} {
		p := Pack(s)
		require.True(t, p.Span().Equal(s), "%v", s)
		require.Equal(t, s.TableID, p.Table())
		require.Equal(t, len(s.StartKey) == 0 && len(s.EndKey) == 0, p.keys == nil, "%v", s)
		require.Equal(t, s.String(), p.String())
		for _, k := range []string{"", "a", "b", "c", "d", "e"} {
			require.Equal(t, s.Contains([]byte(k)), p.Contains([]byte(k)), "%v contains %q", s, k)
		}
	}
	require.Equal(t, uintptr(16), unsafe.Sizeof(PackedSpan{}))
}

// TestIsWholeTable: no keys, nil or empty, is the whole table; any key
// narrows it.
func TestIsWholeTable(t *testing.T) {
	require.True(t, TableSpan(3).IsWholeTable())
	require.True(t, Span{TableID: 3, StartKey: []byte{}, EndKey: []byte{}}.IsWholeTable())
	require.False(t, Span{TableID: 3, StartKey: []byte("a")}.IsWholeTable())
	require.False(t, Span{TableID: 3, EndKey: []byte("a")}.IsWholeTable())
}

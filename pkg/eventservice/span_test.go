package eventservice

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
)

// TestDispatcherSpanKeepsTheSpan: a whole table carries no keys (nil and
// empty keys alike), a narrower span gets its keys back as given, and a
// dispatcher stays within its 320-byte size class (a common.Span in it
// took 40 bytes more: the next class, 384, at a million dispatchers 64 MB).
func TestDispatcherSpanKeepsTheSpan(t *testing.T) {
	for _, s := range []common.Span{
		common.TableSpan(7),
		{TableID: 7, StartKey: []byte{}, EndKey: []byte{}},
		{TableID: 7, StartKey: []byte("a"), EndKey: []byte("c")},
		{TableID: 7, EndKey: []byte("c")},
	} {
		ds := dispatcherSpanOf(s)
		require.True(t, ds.span().Equal(s), "%v", s)
		require.Equal(t, len(s.StartKey) == 0 && len(s.EndKey) == 0, ds.keys == nil, "%v", s)
	}
	require.LessOrEqual(t, unsafe.Sizeof(dispatcher{}), uintptr(320))
}

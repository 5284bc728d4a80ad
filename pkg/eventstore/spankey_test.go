package eventstore

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
)

// TestSpanKeysAreEqualExactlyForEqualSpans: nil and empty keys are the
// same span, a whole table allocates nothing, and the start key's length
// keeps a split between start and end keys from colliding.
func TestSpanKeysAreEqualExactlyForEqualSpans(t *testing.T) {
	whole := common.TableSpan(7)
	require.Equal(t, spanKeyOf(whole), spanKeyOf(common.Span{TableID: 7, StartKey: []byte{}, EndKey: []byte{}}))
	require.Equal(t, spanKey{table: 7}, spanKeyOf(whole))
	require.Zero(t, testing.AllocsPerRun(100, func() { _ = spanKeyOf(whole) }))

	spans := []common.Span{
		whole,
		common.TableSpan(8),
		{TableID: 7, StartKey: []byte("ab"), EndKey: []byte("c")},
		{TableID: 7, StartKey: []byte("a"), EndKey: []byte("bc")},
		{TableID: 7, EndKey: []byte("abc")},
		{TableID: 7, StartKey: []byte("abc")},
		{TableID: 8, StartKey: []byte("ab"), EndKey: []byte("c")},
	}
	for i, a := range spans {
		for j, b := range spans {
			require.Equal(t, i == j, spanKeyOf(a) == spanKeyOf(b), "%v and %v", a, b)
		}
		clone := common.Span{TableID: a.TableID, StartKey: append([]byte(nil), a.StartKey...), EndKey: append([]byte(nil), a.EndKey...)}
		require.Equal(t, spanKeyOf(a), spanKeyOf(clone))
	}
}

// TestSubscriptionsOfOneSpanAreUnlinkedInAnyOrder: a span's subscriptions
// chain from subsBySpan; removing the head, a middle one or the tail
// leaves the others findable, and the last removal deletes the entry.
func TestSubscriptionsOfOneSpanAreUnlinkedInAnyOrder(t *testing.T) {
	span := common.TableSpan(3)
	key := spanKeyOf(span)
	for _, order := range [][]int{{0, 1, 2}, {1, 0, 2}, {2, 1, 0}, {1, 2, 0}} {
		s := &Store{}
		s.mu.subsBySpan = make(map[spanKey]uint64)
		subs := make([]*subscription, 3)
		for i := range subs {
			subs[i] = &subscription{id: uint64(i + 1), span: common.Pack(span)}
			subs[i].nextSameSpan = s.spanHeadLocked(key)
			s.mu.subsBySpan[key] = subs[i].id
			s.mu.subs.Add(subs[i].id, subs[i])
		}
		left := map[uint64]bool{1: true, 2: true, 3: true}
		for _, i := range order {
			s.unlinkSpanLocked(subs[i])
			delete(left, subs[i].id)
			require.Nil(t, subs[i].nextSameSpan)
			found := map[uint64]bool{}
			for sub := s.spanHeadLocked(key); sub != nil; sub = sub.nextSameSpan {
				found[sub.id] = true
			}
			require.Equal(t, left, found, "after unlinking %d in order %v", subs[i].id, order)
			_, ok := s.mu.subs.Lookup(subs[i].id)
			require.False(t, ok, "an unlinked subscription is not found by its ID")
			require.Equal(t, len(left), s.mu.subs.Len())
		}
		_, ok := s.mu.subsBySpan[key]
		require.False(t, ok, "the span's entry is deleted with its last subscription")
	}
}

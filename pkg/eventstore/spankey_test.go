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
		require.Equal(t, spanKeyOf(a).SeededHash(42), spanKeyOf(clone).SeededHash(42), "equal keys hash alike")
	}
}

// TestSpansOfOneTableHaveTheirOwnChains: the whole table and two of its
// ranges, each subscribed to, are three chains in subsBySpan, each found
// by its own key (the map tells keys apart by asking a chain's head for
// its span), and unlinking one leaves the others.
func TestSpansOfOneTableHaveTheirOwnChains(t *testing.T) {
	spans := []common.Span{
		common.TableSpan(7),
		{TableID: 7, StartKey: []byte("a"), EndKey: []byte("m")},
		{TableID: 7, StartKey: []byte("m"), EndKey: []byte("z")},
	}
	s := &Store{}
	subs := make([]*subscription, len(spans))
	for i, span := range spans {
		subs[i] = &subscription{id: uint64(i + 1), span: common.Pack(span)}
		subs[i].slot = s.mu.subs.Take(subs[i])
		s.linkSpanLocked(spanKeyOf(span), subs[i])
	}
	for i, span := range spans {
		require.Equal(t, subs[i].slot, s.spanHeadLocked(spanKeyOf(span)), "span %v", span)
	}
	s.unlinkSpanLocked(subs[1])
	require.Zero(t, s.spanHeadLocked(spanKeyOf(spans[1])))
	require.Equal(t, subs[0].slot, s.spanHeadLocked(spanKeyOf(spans[0])))
	require.Equal(t, subs[2].slot, s.spanHeadLocked(spanKeyOf(spans[2])))
	require.Equal(t, 2, s.mu.subsBySpan.Len())
}

// TestSubscriptionsOfOneSpanAreUnlinkedInAnyOrder: a span's subscriptions
// chain from subsBySpan; removing the head, a middle one or the tail
// leaves the others findable, and the last removal deletes the entry.
func TestSubscriptionsOfOneSpanAreUnlinkedInAnyOrder(t *testing.T) {
	span := common.TableSpan(3)
	key := spanKeyOf(span)
	for _, order := range [][]int{{0, 1, 2}, {1, 0, 2}, {2, 1, 0}, {1, 2, 0}} {
		s := &Store{}
		subs := make([]*subscription, 3)
		for i := range subs {
			subs[i] = &subscription{id: uint64(i + 1), span: common.Pack(span)}
			subs[i].slot = s.mu.subs.Take(subs[i])
			s.linkSpanLocked(key, subs[i])
		}
		left := map[uint64]bool{1: true, 2: true, 3: true}
		for _, i := range order {
			s.unlinkSpanLocked(subs[i])
			delete(left, subs[i].id)
			require.Zero(t, subs[i].nextSameSpan)
			found := map[uint64]bool{}
			for sub := s.subAtLocked(s.spanHeadLocked(key)); sub != nil; sub = s.subAtLocked(sub.nextSameSpan) {
				found[sub.id] = true
			}
			require.Equal(t, left, found, "after unlinking %d in order %v", subs[i].id, order)
			require.Nil(t, s.subAtLocked(subs[i].slot), "an unlinked subscription's slot is free")
			held := 0
			for range s.mu.subs.All() {
				held++
			}
			require.Equal(t, len(left), held)
		}
		require.Zero(t, s.mu.subsBySpan.Len(), "the span's entry is deleted with its last subscription")
	}
}

package eventstore

import "github.com/cdcflow/eventservice/pkg/common"

// spanKey identifies a span in the store's maps: the table and, for a
// span narrower than its table, common.Span.Key. A whole-table span, the
// common case, has keys "" and costs no allocation: at a million
// registrations a key string each was a million more objects for every GC
// cycle to mark.
type spanKey struct {
	table int64
	keys  string
}

// spanKeyOf returns span's key. Spans equal under common.Span.Equal
// (nil and empty keys alike) have equal keys.
func spanKeyOf(span common.Span) spanKey {
	if span.IsWholeTable() {
		return spanKey{table: span.TableID}
	}
	return spanKey{table: span.TableID, keys: span.Key()} // never "": Key starts with the table
}

// subAtLocked returns the subscription in slot i, nil for slot 0 or a
// free one. REQUIRES: s.mu held.
func (s *Store) subAtLocked(i uint32) *subscription {
	sub, _ := s.mu.subs.Get(i)
	return sub
}

// unlinkSpanLocked removes sub from its span's chain in subsBySpan and
// frees its slot. REQUIRES: s.mu held.
func (s *Store) unlinkSpanLocked(sub *subscription) {
	key := spanKeyOf(sub.span.Span())
	if head := s.mu.subsBySpan[key]; head == sub.slot {
		if sub.nextSameSpan == 0 {
			delete(s.mu.subsBySpan, key)
		} else {
			s.mu.subsBySpan[key] = sub.nextSameSpan
		}
	} else {
		for prev := s.subAtLocked(head); prev != nil; prev = s.subAtLocked(prev.nextSameSpan) {
			if prev.nextSameSpan == sub.slot {
				prev.nextSameSpan = sub.nextSameSpan
				break
			}
		}
	}
	sub.nextSameSpan = 0
	s.mu.subs.Free(sub.slot, sub)
}

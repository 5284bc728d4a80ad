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

// SeededHash hashes k under seed (slots.Key): the table, then the key
// string eight bytes at a time.
func (k spanKey) SeededHash(seed uint64) uint64 {
	h := common.Mix64(uint64(k.table) ^ seed)
	for rest := k.keys; rest != ""; {
		var w uint64
		n := min(8, len(rest))
		for i := range n {
			w |= uint64(rest[i]) << (8 * i)
		}
		h = common.Mix64(h ^ w ^ uint64(n)<<56)
		rest = rest[n:]
	}
	return h
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

// spanKeyAtLocked is subsBySpan's keyAt: the span key of the
// subscription in slot i, which the map holds. REQUIRES: s.mu held.
func (s *Store) spanKeyAtLocked(i uint32) spanKey {
	return spanKeyOf(s.subAtLocked(i).span.Span())
}

// spanHeadLocked returns the slot of the newest subscription of the span
// whose key is key, 0 if none. REQUIRES: s.mu held.
func (s *Store) spanHeadLocked(key spanKey) uint32 {
	head, _ := s.mu.subsBySpan.Get(key, s.spanKeyAtLocked)
	return head
}

// linkSpanLocked makes sub, which holds its slot, the newest of its span's
// chain in subsBySpan. REQUIRES: s.mu held.
func (s *Store) linkSpanLocked(key spanKey, sub *subscription) {
	sub.nextSameSpan = s.spanHeadLocked(key) // 0 if none
	s.mu.subsBySpan.Set(key, sub.slot, s.spanKeyAtLocked)
}

// unlinkSpanLocked removes sub from its span's chain in subsBySpan and
// frees its slot. REQUIRES: s.mu held.
func (s *Store) unlinkSpanLocked(sub *subscription) {
	key := spanKeyOf(sub.span.Span())
	if head := s.spanHeadLocked(key); head == sub.slot {
		if sub.nextSameSpan == 0 {
			s.mu.subsBySpan.Delete(key, s.spanKeyAtLocked)
		} else {
			s.mu.subsBySpan.Set(key, sub.nextSameSpan, s.spanKeyAtLocked)
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

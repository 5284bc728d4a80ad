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

// spanHeadLocked returns the newest live subscription of the span whose
// spanKey is key, nil if none. REQUIRES: s.mu held.
func (s *Store) spanHeadLocked(key spanKey) *subscription {
	id, ok := s.mu.subsBySpan[key]
	if !ok {
		return nil
	}
	sub, _ := s.mu.subs.Lookup(id)
	return sub
}

// unlinkSpanLocked removes sub from its span's chain in subsBySpan, and
// from subs. REQUIRES: s.mu held.
func (s *Store) unlinkSpanLocked(sub *subscription) {
	key := spanKeyOf(sub.span.Span())
	head := s.spanHeadLocked(key)
	s.mu.subs.Remove(sub.id, sub)
	if head == sub {
		if sub.nextSameSpan == nil {
			delete(s.mu.subsBySpan, key)
		} else {
			s.mu.subsBySpan[key] = sub.nextSameSpan.id
		}
		sub.nextSameSpan = nil
		return
	}
	for prev := head; prev != nil; prev = prev.nextSameSpan {
		if prev.nextSameSpan == sub {
			prev.nextSameSpan = sub.nextSameSpan
			sub.nextSameSpan = nil
			return
		}
	}
}

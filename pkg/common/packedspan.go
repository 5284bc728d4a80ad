package common

// PackedSpan is a Span in 16 bytes where a Span takes 56: the table, and
// the keys only for a span narrower than its table (nil for a whole table,
// the common case). Per-dispatcher state keeps its span so: at a million
// dispatchers the 40 bytes decide a size class (64 MB).
type PackedSpan struct {
	table int64
	keys  *spanKeys
}

type spanKeys struct{ start, end []byte }

// Pack returns s packed; the keys are shared, not copied.
func Pack(s Span) PackedSpan {
	if s.IsWholeTable() {
		return PackedSpan{table: s.TableID}
	}
	return PackedSpan{table: s.TableID, keys: &spanKeys{start: s.StartKey, end: s.EndKey}}
}

// Table is the span's table.
func (p PackedSpan) Table() int64 { return p.table }

// Span returns the span (sharing the keys).
func (p PackedSpan) Span() Span {
	if p.keys == nil {
		return TableSpan(p.table)
	}
	return Span{TableID: p.table, StartKey: p.keys.start, EndKey: p.keys.end}
}

// Contains is Span.Contains; a whole table contains every key.
func (p PackedSpan) Contains(key []byte) bool {
	return p.keys == nil || p.Span().Contains(key)
}

// String is Span.String.
func (p PackedSpan) String() string { return p.Span().String() }

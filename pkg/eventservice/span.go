package eventservice

import "github.com/cdcflow/eventservice/pkg/common"

// dispatcherSpan is a dispatcher's span in 16 bytes where a common.Span
// takes 56: the table, and the keys only for a span narrower than its
// table (nil for a whole table, the common case). At a million
// dispatchers the 40 bytes are what keeps a dispatcher in a smaller size
// class.
type dispatcherSpan struct {
	table int64
	keys  *spanKeys
}

type spanKeys struct{ start, end []byte }

func dispatcherSpanOf(s common.Span) dispatcherSpan {
	if len(s.StartKey) == 0 && len(s.EndKey) == 0 {
		return dispatcherSpan{table: s.TableID}
	}
	return dispatcherSpan{table: s.TableID, keys: &spanKeys{start: s.StartKey, end: s.EndKey}}
}

// span returns the common.Span (sharing the keys).
func (s dispatcherSpan) span() common.Span {
	if s.keys == nil {
		return common.TableSpan(s.table)
	}
	return common.Span{TableID: s.table, StartKey: s.keys.start, EndKey: s.keys.end}
}

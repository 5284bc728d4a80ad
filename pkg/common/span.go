package common

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
)

// Span is a key range [StartKey, EndKey) of one table. An empty EndKey means
// "to the end of the table", so Span{TableID: t} covers the whole table.
type Span struct {
	TableID  int64
	StartKey []byte
	EndKey   []byte
}

// TableSpan returns the span covering all of table id.
func TableSpan(id int64) Span { return Span{TableID: id} }

// IsWholeTable reports whether s covers its whole table (no keys; nil and
// empty alike).
func (s Span) IsWholeTable() bool { return len(s.StartKey) == 0 && len(s.EndKey) == 0 }

// MaxSpanKeyBytes bounds a span's start and end keys: spans arrive in
// control requests from other processes and are kept per dispatcher, so
// their size is bounded like every other input (a real table's keys are a
// few hundred bytes at most).
const MaxSpanKeyBytes = 16 << 10

// Validate reports why s is not a usable span: a negative table ID, a key
// longer than MaxSpanKeyBytes, or an EndKey that is not after StartKey.
// Errors wrap ErrInvalidSpan.
func (s Span) Validate() error {
	var errs []error
	if s.TableID < 0 {
		errs = append(errs, fmt.Errorf("%w: negative table id %d", ErrInvalidSpan, s.TableID))
	}
	if len(s.StartKey) > MaxSpanKeyBytes || len(s.EndKey) > MaxSpanKeyBytes {
		errs = append(errs, fmt.Errorf("%w: keys of %d and %d bytes, at most %d", ErrInvalidSpan, len(s.StartKey), len(s.EndKey), MaxSpanKeyBytes))
	}
	if len(s.EndKey) > 0 && bytes.Compare(s.StartKey, s.EndKey) >= 0 {
		errs = append(errs, fmt.Errorf("%w: end key %x is not after start key %x", ErrInvalidSpan, s.EndKey, s.StartKey))
	}
	return errors.Join(errs...)
}

// Contains reports whether key lies inside s.
func (s Span) Contains(key []byte) bool {
	if bytes.Compare(key, s.StartKey) < 0 {
		return false
	}
	return len(s.EndKey) == 0 || bytes.Compare(key, s.EndKey) < 0
}

// Overlaps reports whether s and o share at least one key. Spans of different
// tables never overlap.
func (s Span) Overlaps(o Span) bool {
	if s.TableID != o.TableID {
		return false
	}
	// s starts before o ends and o starts before s ends.
	sBeforeOEnd := len(o.EndKey) == 0 || bytes.Compare(s.StartKey, o.EndKey) < 0
	oBeforeSEnd := len(s.EndKey) == 0 || bytes.Compare(o.StartKey, s.EndKey) < 0
	return sBeforeOEnd && oBeforeSEnd
}

// Equal reports whether s and o are the same span.
func (s Span) Equal(o Span) bool {
	return s.TableID == o.TableID && bytes.Equal(s.StartKey, o.StartKey) && bytes.Equal(s.EndKey, o.EndKey)
}

// Key returns a string that is equal for equal spans, usable as a map key.
//
// It is "<table>/<len(start)>:<start><end>": the start key's length makes
// the split between the two keys unambiguous. It is built with strconv,
// not fmt: a registration computes it several times.
func (s Span) Key() string {
	b := make([]byte, 0, 24+len(s.StartKey)+len(s.EndKey))
	b = strconv.AppendInt(b, s.TableID, 10)
	b = append(b, '/')
	b = strconv.AppendInt(b, int64(len(s.StartKey)), 10)
	b = append(b, ':')
	b = append(b, s.StartKey...)
	b = append(b, s.EndKey...)
	return string(b)
}

// String formats the span for logs.
func (s Span) String() string {
	return fmt.Sprintf("table %d [%x, %x)", s.TableID, s.StartKey, s.EndKey)
}

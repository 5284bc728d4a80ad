package optcheck

import (
	"errors"
	"fmt"
	"reflect"
)

// Problems accumulates validation failures.
type Problems struct {
	sentinel error
	errs     []error
}

// New returns an empty list whose errors wrap sentinel.
func New(sentinel error) *Problems { return &Problems{sentinel: sentinel} }

// Addf records a problem.
func (p *Problems) Addf(format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf("%w: %s", p.sentinel, fmt.Sprintf(format, args...)))
}

// Require records msg unless ok.
func (p *Problems) Require(ok bool, format string, args ...any) {
	if !ok {
		p.Addf(format, args...)
	}
}

// IntRange records a problem unless lo <= v <= hi.
func (p *Problems) IntRange(name string, v, lo, hi int) {
	if v < lo || v > hi {
		p.Addf("%s %d not in [%d, %d]", name, v, lo, hi)
	}
}

// Required records a problem unless v is set: neither a nil interface nor an
// interface holding a nil pointer, map, slice, channel or function (a
// typed nil such as (*eventstore.Store)(nil) passes a plain != nil check
// and panics at first use, possibly under a lock).
func (p *Problems) Required(name string, v any) {
	switch {
	case v == nil:
		p.Addf("%s is required", name)
	case IsNil(v):
		p.Addf("%s is a nil %T", name, v)
	}
}

// NotTypedNil records a problem if v is an interface holding a nil pointer
// (or map, slice, channel, function), for optional fields whose nil
// interface means "the default" but whose typed nil would panic.
func (p *Problems) NotTypedNil(name string, v any) {
	if v != nil && IsNil(v) {
		p.Addf("%s is a nil %T (leave it unset for the default)", name, v)
	}
}

// IsNil reports whether v is nil or holds a nil pointer, map, slice,
// channel, function or interface.
func IsNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Chan, reflect.Func, reflect.Interface, reflect.UnsafePointer:
		return rv.IsNil()
	default:
		return false
	}
}

// Err returns every problem joined, or nil.
func (p *Problems) Err() error { return errors.Join(p.errs...) }

// Package optcheck collects the problems of an options struct so that
// Validate methods report every bad field at once, each wrapping the
// package's sentinel error.
//
// Invariant: Err returns nil exactly when no problem was added; every
// error it returns satisfies errors.Is(err, sentinel).
package optcheck

import (
	"errors"
	"fmt"
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

// Err returns every problem joined, or nil.
func (p *Problems) Err() error { return errors.Join(p.errs...) }

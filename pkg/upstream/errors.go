package upstream

import "errors"

// Sentinel errors. Every error this package returns wraps one of these (or,
// for spans, common.ErrInvalidSpan as well), so callers test with errors.Is.
var (
	// ErrInvalidOptions: GeneratorOptions failed validation. The returned
	// error joins one wrapped ErrInvalidOptions per bad field.
	ErrInvalidOptions = errors.New("upstream: invalid options")
	// ErrInvalidArgument: a nil sink, an invalid span and the like.
	ErrInvalidArgument = errors.New("upstream: invalid argument")
	// ErrUnknownTable: a Generator was asked to feed a table outside 1..Tables.
	ErrUnknownTable = errors.New("upstream: unknown table")
	// ErrNoSubscription: Manual.Push found no live subscription of the span.
	ErrNoSubscription = errors.New("upstream: no live subscription for span")
	// ErrClosed: the Generator is closed.
	ErrClosed = errors.New("upstream: closed")
	// ErrAlreadyStarted: Generator.Start was called twice.
	ErrAlreadyStarted = errors.New("upstream: already started")
)

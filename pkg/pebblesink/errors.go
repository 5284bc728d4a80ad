package pebblesink

import "errors"

// Sentinel errors of the durable sink.
var (
	// ErrSinkFormat: the directory holds a sink of another layout.
	ErrSinkFormat = errors.New("durable sink of another format")
	// ErrCorruptSink: a stored key or value does not decode.
	ErrCorruptSink = errors.New("corrupt durable sink entry")
	// ErrInvalidTable: a negative table ID, which no span has
	// (common.Span.Validate) and whose key range this layout does not
	// order with the others'.
	ErrInvalidTable = errors.New("invalid table ID")
	// ErrNotBound: a checkpoint of a dispatcher Bind never named, whose
	// rows would have no table to go to.
	ErrNotBound = errors.New("dispatcher not bound to a table")
)

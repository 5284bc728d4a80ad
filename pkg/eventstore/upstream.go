package eventstore

import (
	"context"

	"github.com/cdcflow/eventservice/pkg/common"
)

// Upstream is the source of truth the store caches. The store asks it to feed
// a span from a start-ts; the upstream then pushes rows and resolved-ts
// advances into the Sink it was given, until the Subscription is closed.
//
// Contract for implementations:
//   - Rows pushed for a span have commit-ts > the start-ts of the
//     subscription and lie inside the span.
//   - A batch's ResolvedTs R promises that every row of the span with
//     commit-ts <= R has been pushed, in this batch or an earlier one.
//   - Push may block (the store applies back-pressure when its write queue is
//     full); it returns an error wrapping ErrClosed once the store is closing.
//   - Subscribe must not call the sink synchronously (start a goroutine or
//     queue the work); the store holds no lock across Subscribe, but callers
//     of RegisterDispatcher should not have to reason about re-entrancy.
type Upstream interface {
	Subscribe(span common.Span, startTs common.Ts, sink Sink) (Subscription, error)
}

// Subscription is an upstream feed of one span.
type Subscription interface {
	// Close stops the feed. After Close returns the upstream calls the sink
	// no more. Close is idempotent.
	Close()
}

// Sink receives what the upstream pushes for one subscription.
type Sink interface {
	// Push hands over a batch. Rows that are accepted are owned by the store
	// from then on: the caller must not modify them. Rows that violate the
	// contract are rejected with an error wrapping ErrRowBeforeResolved,
	// ErrRowOutsideSpan or ErrInvalidRow, and counted; the other rows of the
	// batch are still accepted. A ResolvedTs below the current one is
	// rejected with ErrResolvedTsRegressed; zero means "no advance".
	Push(ctx context.Context, b Batch) error
}

// Batch is a group of rows of one subscription plus an optional resolved-ts
// advance that applies after the rows.
type Batch struct {
	Rows       []common.Row
	ResolvedTs common.Ts
}

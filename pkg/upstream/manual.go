package upstream

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
)

// Manual is an Upstream for tests: it records subscriptions and pushes
// exactly the batches the test gives it, nothing else. It never validates
// pushed rows, so tests can feed the store rows that break the contract.
//
// Manual keeps every subscription it ever created (closed ones too) so that
// tests can inspect the history; it is meant for tests, not long runs.
//
// Lock order: Manual.mu is never held while a sink is called; a
// subscription's eventstore.SinkGuard is held across its sink call and
// may be taken before Manual.mu (in Close), never after it.
type Manual struct {
	mu struct {
		sync.Mutex
		// subs holds every subscription, in creation order.
		subs   []*manualSub
		nextID uint64
		// counts is the number of successful Subscribe calls per span.Key().
		counts map[string]int
		// subscribeErr, when not nil, makes Subscribe fail with it.
		subscribeErr error
		// changed is closed and replaced whenever a subscription is
		// created or closed, so waiters never miss a change.
		changed chan struct{}
	}
}

var _ eventstore.Upstream = (*Manual)(nil)

// SubscriptionInfo describes one subscription made to a Manual.
type SubscriptionInfo struct {
	ID      uint64
	Span    common.Span
	StartTs common.Ts
	// Live is false once the subscription was closed.
	Live bool
}

type manualSub struct {
	m       *Manual
	id      uint64
	span    common.Span
	startTs common.Ts
	guard   *eventstore.SinkGuard
	// live is guarded by m.mu.
	live bool
}

// NewManual returns a Manual with no subscriptions.
func NewManual() *Manual {
	m := &Manual{}
	m.mu.counts = make(map[string]int)
	m.mu.changed = make(chan struct{})
	return m
}

// Subscribe records a subscription of span from startTs. It never calls the
// sink; only Push does. It fails with the error set by SetSubscribeErr, if
// any, and with ErrInvalidArgument for a nil sink or an invalid span.
func (m *Manual) Subscribe(span common.Span, startTs common.Ts, sink eventstore.Sink) (eventstore.Subscription, error) {
	if sink == nil {
		return nil, fmt.Errorf("%w: nil sink", ErrInvalidArgument)
	}
	if err := span.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.mu.subscribeErr; err != nil {
		return nil, err
	}
	m.mu.nextID++
	s := &manualSub{
		m:       m,
		id:      m.mu.nextID,
		span:    cloneSpan(span),
		startTs: startTs,
		guard:   eventstore.NewSinkGuard(sink),
		live:    true,
	}
	m.mu.subs = append(m.mu.subs, s)
	m.mu.counts[span.Key()]++
	m.notifyLocked()
	return s, nil
}

// Close stops the subscription: once it returns, Manual never calls its sink
// again. A Push in progress is cancelled through its context and waited for.
// Idempotent.
func (s *manualSub) Close() {
	if !s.guard.Close() {
		return
	}
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	s.live = false
	s.m.notifyLocked()
}

// REQUIRES: m.mu held.
func (m *Manual) notifyLocked() {
	close(m.mu.changed)
	m.mu.changed = make(chan struct{})
}

// SetSubscribeErr makes every later Subscribe fail with err (until it is
// called again with nil). Failed calls are not counted by SubscribeCount.
func (m *Manual) SetSubscribeErr(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.mu.subscribeErr = err
}

// Push hands b to every live subscription whose span equals span, one after
// the other, each with its own deep copy of the rows (the sink owns what it
// accepts). It returns an error wrapping ErrNoSubscription when no
// subscription took the batch, and otherwise the sinks' errors joined. A
// subscription closed concurrently is skipped; ctx cancels a blocked sink.
func (m *Manual) Push(ctx context.Context, span common.Span, b eventstore.Batch) error {
	m.mu.Lock()
	var targets []*manualSub
	for _, s := range m.mu.subs {
		if s.live && s.span.Equal(span) {
			targets = append(targets, s)
		}
	}
	m.mu.Unlock()

	delivered := 0
	var errs []error
	for _, s := range targets {
		copied := eventstore.Batch{Rows: cloneRows(b.Rows), ResolvedTs: b.ResolvedTs}
		pctx, cancel := context.WithCancel(ctx)
		err := s.guard.Push(pctx, cancel, copied)
		cancel()
		if errors.Is(err, eventstore.ErrSubscriptionClosed) {
			continue
		}
		delivered++
		if err != nil {
			errs = append(errs, fmt.Errorf("upstream: push to subscription %d: %w", s.id, err))
		}
	}
	if delivered == 0 {
		return fmt.Errorf("%w: %v", ErrNoSubscription, span)
	}
	return errors.Join(errs...)
}

// Subscriptions returns every subscription made so far, in creation order.
func (m *Manual) Subscriptions() []SubscriptionInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]SubscriptionInfo, 0, len(m.mu.subs))
	for _, s := range m.mu.subs {
		out = append(out, SubscriptionInfo{ID: s.id, Span: cloneSpan(s.span), StartTs: s.startTs, Live: s.live})
	}
	return out
}

// SubscribeCount returns how many times span was successfully subscribed,
// live or not, so tests can check that the store shares subscriptions.
func (m *Manual) SubscribeCount(span common.Span) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mu.counts[span.Key()]
}

// Changed returns a channel that is closed at the next subscription create
// or close. Take it, check the state, then wait: no change is missed.
func (m *Manual) Changed() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.mu.changed
}

// WaitLive blocks until exactly n subscriptions of span are live, or ctx is
// done (then it returns ctx.Err()). Tests use it instead of sleeping.
func (m *Manual) WaitLive(ctx context.Context, span common.Span, n int) error {
	for {
		m.mu.Lock()
		live := 0
		for _, s := range m.mu.subs {
			if s.live && s.span.Equal(span) {
				live++
			}
		}
		changed := m.mu.changed
		m.mu.Unlock()
		if live == n {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// cloneSpan deep-copies s (empty keys become nil), so a caller reusing its
// key buffers cannot change a recorded subscription.
func cloneSpan(s common.Span) common.Span {
	s.StartKey = append([]byte(nil), s.StartKey...)
	s.EndKey = append([]byte(nil), s.EndKey...)
	return s
}

func cloneRows(rows []common.Row) []common.Row {
	if rows == nil {
		return nil
	}
	out := make([]common.Row, len(rows))
	for i := range rows {
		out[i] = rows[i].Clone()
	}
	return out
}

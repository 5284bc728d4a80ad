package eventstore

import (
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/common"
)

// RegisterDispatcher registers dispatcher id reading span from startTs
// (exclusive). Dispatchers with an identical span share a subscription when
// the subscription still holds data from startTs; otherwise a new one is
// subscribed at the upstream. If the subscription's resolved-ts is already
// past startTs, the notifier is called before RegisterDispatcher returns, on
// the caller's goroutine; later calls come from the store's write workers.
func (s *Store) RegisterDispatcher(id common.DispatcherID, span common.Span, startTs common.Ts, notifier Notifier) error {
	_, err := s.RegisterDispatcherHandle(id, span, startTs, notifier)
	return err
}

// RegisterDispatcherHandle is RegisterDispatcher returning the new
// registration's Handle, which Handle(id) would give: without the lookup
// by ID that Handle makes, a map probe on a 16-byte ID that at a million
// registrations is a cold cache line each.
func (s *Store) RegisterDispatcherHandle(id common.DispatcherID, span common.Span, startTs common.Ts, notifier Notifier) (Handle, error) {
	if id.IsZero() {
		return Handle{}, fmt.Errorf("%w: zero dispatcher id", ErrInvalidArgument)
	}
	if f, isFunc := notifier.(NotifierFunc); notifier == nil || isFunc && f == nil {
		return Handle{}, fmt.Errorf("%w: nil notifier for dispatcher %v", ErrInvalidArgument, id)
	}
	if err := span.Validate(); err != nil {
		return Handle{}, fmt.Errorf("%w: dispatcher %v: %w", ErrInvalidArgument, id, err)
	}
	span = common.Span{TableID: span.TableID, StartKey: cloneKey(span.StartKey), EndKey: cloneKey(span.EndKey)}
	sb, resolved, maxCommit, err := s.addSubscriber(registration{id: id, startTs: startTs, notifier: notifier}, span)
	if err != nil {
		return Handle{}, err
	}

	// The write worker may have advanced before sb was published; catch up
	// here so a registration never waits for the next advance.
	if sb.notify(s, resolved, maxCommit) {
		s.metrics.notifications.Inc()
	}
	return Handle{sb: sb}, nil
}

// registration is what RegisterDispatcher knows of its subscriber before
// it knows where the subscriber lives: in a subscription it shares (an
// object of its own), or in the one it subscribes (subscriptionWithFirst).
type registration struct {
	id       common.DispatcherID
	startTs  common.Ts
	notifier Notifier
}

// init makes sb the subscriber of r.
func (r registration) init(sb *subscriber) {
	sb.id, sb.startTs, sb.notifier, sb.checkpoint = r.id, r.startTs, r.notifier, r.startTs
	sb.mu.notifies = sampleOffset(r.id)
}

// subscriptionWithFirst is a new subscription and the subscriber whose
// registration subscribed it, in one object: one object fewer per
// dispatcher for the GC to mark when, as usual, no other dispatcher
// shares the span.
type subscriptionWithFirst struct {
	sub   subscription
	first subscriber
}

// addSubscriber attaches the subscriber of r to a subscription of span (an
// existing one that still holds its rows, or a new one subscribed at the
// upstream) and maps it, returning it and the subscription's progress.
// Store.mu is never held across Upstream.Subscribe (the embedder's code,
// which may be slow or panic): the span is marked as being subscribed,
// other registrations of it wait for that mark (outside the lock) and then
// look again, and the new subscription is published under the lock
// afterwards.
func (s *Store) addSubscriber(r registration, span common.Span) (sb *subscriber, resolved, maxCommit common.Ts, err error) {
	key := spanKeyOf(span) // once: a registration used to build it three times
	for {
		sb, wait, err := s.attachOrReserve(r, key)
		switch {
		case err != nil:
			return nil, 0, 0, err
		case sb != nil:
			resolved, maxCommit = sb.sub.progress()
			return sb, resolved, maxCommit, nil
		case wait != nil:
			if h := s.knobs.subscribeWaits; h != nil {
				h()
			}
			select { // another registration is subscribing the span
			case <-wait:
				continue
			case <-s.closing:
				return nil, 0, 0, ErrClosed
			}
		}
		// This registration reserved the span: it subscribes.
		if sb, err = s.subscribeReserved(r, span, key); err != nil {
			return nil, 0, 0, err
		}
		resolved, maxCommit = sb.sub.progress()
		return sb, resolved, maxCommit, nil
	}
}

// attachOrReserve attaches r's subscriber to a sharable subscription of
// the span whose key is key if there is one (returning the subscriber);
// else, if another registration is subscribing the span, returns the
// channel that closes when it is done; else reserves the span for this
// registration (all nil).
func (s *Store) attachOrReserve(r registration, key spanKey) (*subscriber, <-chan struct{}, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed || s.isClosing() {
		return nil, nil, ErrClosed
	}
	if _, ok := s.mu.dispatchers.Lookup(r.id); ok {
		return nil, nil, fmt.Errorf("%w: %v", ErrDispatcherExists, r.id)
	}
	if sub := s.findSharableLocked(key, r.startTs); sub != nil {
		sb := new(subscriber)
		r.init(sb)
		s.attachLocked(sb, sub)
		return sb, nil, nil
	}
	if ch, ok := s.mu.subscribing[key]; ok {
		if ch == nil { // the first waiter makes the channel: most reservations have none
			ch = make(chan struct{})
			s.mu.subscribing[key] = ch
		}
		return nil, ch, nil
	}
	s.mu.subscribing[key] = nil
	return nil, nil, nil
}

// attachLocked attaches sb to sub and maps it. REQUIRES: s.mu held.
func (s *Store) attachLocked(sb *subscriber, sub *subscription) {
	sb.sub = sub
	sub.mu.Lock()
	sub.addSubscriberLocked(sb)
	s.noteGCLocked(sub, time.Time{})
	sub.mu.Unlock()
	s.mu.dispatchers.Add(sb)
	s.metrics.dispatchers.Set(float64(s.mu.dispatchers.Len()))
}

// subscribeReserved subscribes span at the upstream, without Store.mu, for
// registration r, which reserved it, publishes the subscription with r's
// subscriber attached (returning the subscriber), and only then releases
// the reservation (by defer: the upstream may panic), so the registrations
// waiting for it find the subscription.
func (s *Store) subscribeReserved(r registration, span common.Span, key spanKey) (*subscriber, error) {
	startTs := r.startTs
	defer func() {
		s.mu.Lock()
		if ch := s.mu.subscribing[key]; ch != nil {
			close(ch)
		}
		delete(s.mu.subscribing, key)
		s.mu.Unlock()
	}()
	s.mu.Lock()
	s.mu.nextSubID++
	id := s.mu.nextSubID
	s.mu.Unlock()
	pair := &subscriptionWithFirst{sub: subscription{id: id, span: common.Pack(span), startTs: startTs, pushedResolved: startTs}}
	sub, sb := &pair.sub, &pair.first
	r.init(sb)
	sub.mu.resolved = startTs
	sub.mu.lowWatermark = startTs
	// Nothing at or below startTs is ever written (Push refuses it), so
	// there is nothing to collect there: a new subscription has no
	// pending GC range (no heap entry, no tombstone).
	sub.mu.gcTarget, sub.mu.gcDone = startTs, startTs
	sub.store = s
	up, err := s.opts.Upstream.Subscribe(span, startTs, (*sink)(sub))
	if err != nil {
		return nil, fmt.Errorf("eventstore: subscribe %v at upstream: %w", span, err)
	}
	sub.upstream = up
	if err := s.publishSubscription(sb, sub, key); err != nil {
		return nil, err
	}
	return sb, nil
}

// publishSubscription makes sub, just subscribed, visible and attaches sb
// to it. If the store closed meanwhile, or sb's ID was registered by a
// concurrent call, the subscription is ended instead.
func (s *Store) publishSubscription(sb *subscriber, sub *subscription, key spanKey) error {
	s.mu.Lock()
	var err error
	switch _, exists := s.mu.dispatchers.Lookup(sb.id); {
	case s.mu.closed || s.isClosing():
		err = ErrClosed
	case exists:
		err = fmt.Errorf("%w: %v", ErrDispatcherExists, sb.id)
	}
	if err != nil {
		s.mu.Unlock()
		sub.upstream.Close()
		return err
	}
	defer s.mu.Unlock()
	sub.slot = s.mu.subs.Take(sub)
	s.linkSpanLocked(key, sub)
	s.mu.nsubs++
	s.metrics.subscriptions.Set(float64(s.mu.nsubs))
	if ce := s.log.Check(zap.DebugLevel, "subscribed"); ce != nil { // no fields built per registration otherwise
		ce.Write(zap.Uint64("sub", sub.id), zap.Stringer("span", sub.span), zap.Uint64("startTs", uint64(sub.startTs)))
	}
	s.attachLocked(sb, sub)
	return nil
}

// findSharableLocked returns a live subscription of exactly the span whose
// spanKey is key that still holds every row above startTs. REQUIRES: s.mu
// held.
func (s *Store) findSharableLocked(key spanKey, startTs common.Ts) *subscription {
	for sub := s.subAtLocked(s.spanHeadLocked(key)); sub != nil; sub = s.subAtLocked(sub.nextSameSpan) {
		sub.mu.Lock()
		ok := !sub.mu.removed && sub.mu.lowWatermark <= startTs
		sub.mu.Unlock()
		if ok {
			return sub
		}
	}
	return nil
}

// UnregisterDispatcher removes dispatcher id. When it returns, its notifier
// is not running and will not be called again. Do not call it while holding
// a lock the notifier takes. The subscription, if this was its last
// dispatcher, is ended after Options.IdleTTL.
func (s *Store) UnregisterDispatcher(id common.DispatcherID) error {
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	sb, ok := s.mu.dispatchers.Lookup(id)
	if !ok {
		s.mu.Unlock()
		return fmt.Errorf("%w: %v", ErrDispatcherNotFound, id)
	}
	s.mu.dispatchers.Remove(sb)
	s.metrics.dispatchers.Set(float64(s.mu.dispatchers.Len()))
	now := s.opts.Clock.Now()
	sb.sub.mu.Lock()
	if sb.sub.removeSubscriberLocked(sb, now) {
		s.scheduleIdleLocked(sb.sub, now)
	}
	s.noteGCLocked(sb.sub, now)
	sb.sub.mu.Unlock()
	s.mu.Unlock()
	sb.stop(s.knobs.stopWaits)
	return nil
}

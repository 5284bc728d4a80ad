package eventcollector

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// DispatcherSpec is one dispatcher for AddDispatchers: what AddDispatcher
// takes.
type DispatcherSpec struct {
	ID      common.DispatcherID
	Span    common.Span
	StartTs common.Ts
}

// AddDispatchers adds every spec as AddDispatcher would, registering them
// with the service in batches of up to messaging.MaxRegisterBatch, one
// control call each (a changefeed's million tables take a thousand calls,
// not a million round trips). errs[i] is specs[i]'s outcome, nil when it
// was added; a spec that failed was dropped again, as AddDispatcher drops
// it. Errors are AddDispatcher's; a batch the service could not be asked
// fails its entries with the call's error.
func (c *Collector) AddDispatchers(ctx context.Context, specs []DispatcherSpec) []error {
	errs := make([]error, len(specs))
	for i, sp := range specs {
		switch {
		case sp.ID.IsZero():
			errs[i] = fmt.Errorf("%w: zero dispatcher id", ErrInvalidArgument)
		default:
			if err := sp.Span.Validate(); err != nil {
				errs[i] = fmt.Errorf("%w: %w", ErrInvalidArgument, err)
			}
		}
	}
	c.adminMu.Lock()
	defer c.adminMu.Unlock()
	for start := 0; start < len(specs); start += messaging.MaxRegisterBatch {
		end := min(start+messaging.MaxRegisterBatch, len(specs))
		c.addBatch(ctx, specs[start:end], errs[start:end])
	}
	return errs
}

// addBatch adds specs whose errs entry is nil with one RegisterBatch.
// REQUIRES: c.adminMu held, len(specs) <= messaging.MaxRegisterBatch.
func (c *Collector) addBatch(ctx context.Context, specs []DispatcherSpec, errs []error) {
	ds := make([]*dispatcher, len(specs))
	reqs := make([]messaging.RegisterRequest, 0, len(specs))
	idx := make([]int, 0, len(specs)) // reqs[j] is specs[idx[j]]
	c.mu.Lock()
	for i, sp := range specs {
		if errs[i] != nil {
			continue
		}
		if c.mu.closed {
			errs[i] = ErrClosed
			continue
		}
		if _, ok := c.mu.dispatchers.Lookup(sp.ID); ok {
			errs[i] = fmt.Errorf("%w: %v", ErrDispatcherExists, sp.ID)
			continue
		}
		reg := c.regs.next()
		if h := c.knobs.registration; h != nil {
			reg = h(sp.ID)
		}
		d := &dispatcher{id: sp.ID, reg: reg, st: newStream(sp.StartTs), lastHeartbeat: sp.StartTs}
		d.slot = c.mu.dispatchers.Add(d)
		ds[i] = d
		reqs = append(reqs, messaging.RegisterRequest{Dispatcher: sp.ID, Registration: reg, Span: sp.Span,
			StartTs: sp.StartTs, Target: c.opts.Target, Replace: c.opts.TakeOver, Slot: d.slot})
		idx = append(idx, i)
	}
	c.mu.Unlock()
	if len(reqs) == 0 {
		return
	}

	reply, callErr := c.opts.Service.RegisterBatch(ctx, messaging.RegisterBatchRequest{Requests: reqs})
	if callErr == nil && len(reply.Codes) != len(reqs) {
		callErr = fmt.Errorf("%w: %d codes for %d registrations", messaging.ErrInternal, len(reply.Codes), len(reqs))
	}
	// A batch answers with codes; an entry it refused is asked again
	// alone, for the service's own error, which says why (whose identity
	// may not register under which target): refusals are rare, and "permission
	// denied" alone does not tell an operator what to fix.
	refused := make([]error, len(reqs))
	if callErr == nil {
		for j := range reqs {
			if reply.Codes[j] != messaging.CodeOK {
				refused[j] = c.opts.Service.Register(ctx, reqs[j])
			}
		}
	}
	c.mu.Lock()
	for j, i := range idx {
		var err error
		switch {
		case callErr != nil:
			err = callErr
		case reply.Codes[j] != messaging.CodeOK:
			err = refused[j] // nil: registered when asked alone
		}
		if err == nil {
			continue
		}
		d := ds[i]
		d.removed = true
		c.mu.dispatchers.Remove(d)
		errs[i] = fmt.Errorf("eventcollector: register %v: %w", d.id, err)
	}
	c.mu.Unlock()
	if callErr != nil && !errors.Is(callErr, context.Canceled) {
		c.log.Debug("register batch failed", zap.Int("registrations", len(reqs)), zap.Error(callErr))
	}
}

// ForgetDispatchers drops the collector's state of each of ids as
// RemoveDispatcher does (its later messages are ignored; a sink call in
// progress for it is waited for), without telling the service. It is for
// a collector with Options.TakeOver whose link to the service broke and
// that adds the same dispatchers again (AddDispatchers, from their sink's
// checkpoints): the new registrations take the service's old ones over,
// a batch per call, where a RemoveDispatcher each would be a control call
// per dispatcher (a million after a reconnect). errs[i] is ids[i]'s
// outcome: ErrUnknownDispatcher for an ID the collector does not hold (or
// named twice), ErrInvalidArgument for every entry of a collector without
// TakeOver (the service would keep its registrations and refuse the IDs
// again), the context's error for an entry whose sink call was still in
// flight when ctx ended (its state is dropped all the same).
func (c *Collector) ForgetDispatchers(ctx context.Context, ids []common.DispatcherID) []error {
	errs := make([]error, len(ids))
	fail := func(err error) []error {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	if !c.opts.TakeOver {
		return fail(fmt.Errorf("%w: ForgetDispatchers needs Options.TakeOver", ErrInvalidArgument))
	}
	c.adminMu.Lock()
	defer c.adminMu.Unlock()
	c.mu.Lock()
	if c.mu.closed {
		c.mu.Unlock()
		return fail(ErrClosed)
	}
	var inSink chan struct{}
	var waiting []int // entries whose sink call was in flight
	for i, id := range ids {
		d, ok := c.mu.dispatchers.Lookup(id)
		if !ok {
			errs[i] = fmt.Errorf("%w: %v", ErrUnknownDispatcher, id)
			continue
		}
		if ch := c.dropLocked(d); ch != nil {
			inSink = ch // one channel: the sink is called from one goroutine
			waiting = append(waiting, i)
		}
	}
	c.mu.Unlock()
	if inSink == nil {
		return errs
	}
	if h := c.knobs.removeWaitsForSink; h != nil {
		h(ids[waiting[0]])
	}
	select {
	case <-inSink:
	case <-ctx.Done():
		for _, i := range waiting {
			errs[i] = fmt.Errorf("eventcollector: forget %v: a sink call is still in flight: %w", ids[i], ctx.Err())
		}
	}
	return errs
}

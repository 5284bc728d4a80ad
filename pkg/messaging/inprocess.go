package messaging

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
)

// DefaultCapacity is the default per-target inbound queue bound, in messages.
const DefaultCapacity = 4096

// InProcessOptions configures NewInProcess.
type InProcessOptions struct {
	// Capacity bounds each target's queue in messages, a ResolvedBatch
	// counting its entries (Weight). Default
	// DefaultCapacity; negative is invalid.
	Capacity int
	// MaxBytes, if positive, also bounds each target's queue in approximate
	// bytes (Message.Size), but never refuses for good: a batch larger than
	// MaxBytes is admitted alone into an empty queue (a refusal while others
	// are queued is ErrBusy, and Room waits for the queue to empty). Default
	// 0: no byte bound, and Send then never calls Size. Negative is invalid.
	MaxBytes int
	// Logger receives debug logs. Default zap.NewNop().
	Logger *zap.Logger
}

// EnsureDefaults returns a copy of o with every zero field set to its
// default.
func (o InProcessOptions) EnsureDefaults() InProcessOptions {
	if o.Capacity == 0 {
		o.Capacity = DefaultCapacity
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return o
}

// Validate reports every invalid field, each wrapping ErrInvalidOptions. It
// expects defaults filled in (EnsureDefaults).
func (o InProcessOptions) Validate() error {
	var errs []error
	if o.Capacity < 0 {
		errs = append(errs, fmt.Errorf("%w: Capacity %d is negative", ErrInvalidOptions, o.Capacity))
	}
	if o.MaxBytes < 0 {
		errs = append(errs, fmt.Errorf("%w: MaxBytes %d is negative", ErrInvalidOptions, o.MaxBytes))
	}
	return errors.Join(errs...)
}

// registry is an immutable snapshot of the registered targets; it is replaced
// whole, never modified, so Send reads it without a lock.
type registry struct {
	closed  bool
	inboxes map[Target]*Inbox
}

// InProcess is a Transport whose targets are Inboxes in the same process:
// Send takes one mutex (the target inbox's), copies the message pointers into
// a ring and rings a doorbell without blocking. It starts no goroutines.
//
// Lock order: InProcess.mu -> Inbox.mu. Send takes only Inbox.mu.
type InProcess struct {
	opts   InProcessOptions
	logger *zap.Logger
	// reg is the current registry. INVARIANT: only written under mu, and
	// once closed it stays closed.
	reg atomic.Pointer[registry]

	// mu serialises Register, Unregister and Close, the registry's writers.
	mu sync.Mutex
}

var (
	_ Transport    = (*InProcess)(nil)
	_ RoomNotifier = (*InProcess)(nil)
)

// NewInProcess returns an open transport with no targets. Invalid options
// return an error wrapping ErrInvalidOptions.
func NewInProcess(opts InProcessOptions) (*InProcess, error) {
	opts = opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	p := &InProcess{opts: opts, logger: opts.Logger.Named("messaging")}
	p.reg.Store(&registry{inboxes: map[Target]*Inbox{}})
	return p, nil
}

// Register creates the inbox of target. Errors wrap ErrInvalidTarget (a
// name that fails Target.Validate), ErrTargetExists or ErrClosed.
func (p *InProcess) Register(target Target) (*Inbox, error) {
	if err := target.Validate(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.reg.Load()
	if old.closed {
		return nil, fmt.Errorf("%w: register %q", ErrClosed, target)
	}
	if _, ok := old.inboxes[target]; ok {
		return nil, fmt.Errorf("%w: %q", ErrTargetExists, target)
	}
	in := newInbox(target, p.opts.Capacity, p.opts.MaxBytes)
	next := &registry{inboxes: make(map[Target]*Inbox, len(old.inboxes)+1)}
	for t, i := range old.inboxes {
		next.inboxes[t] = i
	}
	next.inboxes[target] = in
	p.reg.Store(next)
	p.logger.Debug("target registered", zap.String("target", string(target)))
	return in, nil
}

// Unregister removes target: further Sends to it fail with ErrUnknownTarget,
// and its inbox's Done closes; messages already queued stay drainable. The
// name may be registered again (a new inbox). Errors wrap ErrUnknownTarget or
// ErrClosed.
func (p *InProcess) Unregister(target Target) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.reg.Load()
	if old.closed {
		return fmt.Errorf("%w: unregister %q", ErrClosed, target)
	}
	in, ok := old.inboxes[target]
	if !ok {
		return fmt.Errorf("%w: %q", ErrUnknownTarget, target)
	}
	next := &registry{inboxes: make(map[Target]*Inbox, len(old.inboxes))}
	for t, i := range old.inboxes {
		if t != target {
			next.inboxes[t] = i
		}
	}
	p.reg.Store(next)
	// A Send that loaded the old registry may still hold in; shutting it
	// makes that Send fail instead of queueing into an orphan.
	in.shut(inboxUnregistered)
	p.logger.Debug("target unregistered", zap.String("target", string(target)))
	return nil
}

// Send implements Transport.
func (p *InProcess) Send(target Target, msgs []Message) error {
	for i, m := range msgs {
		if m == nil || !m.nonNil() {
			return fmt.Errorf("%w: nil message at index %d of %d for %q", ErrInvalidMessage, i, len(msgs), target)
		}
	}
	reg := p.reg.Load()
	if reg.closed {
		return fmt.Errorf("%w: send to %q", ErrClosed, target)
	}
	in := reg.inboxes[target]
	if in == nil {
		return fmt.Errorf("%w: %q", ErrUnknownTarget, target)
	}
	return in.enqueue(msgs)
}

// Room implements RoomNotifier: the target inbox's Room, or a closed
// channel for a target that is not (or no longer) registered.
func (p *InProcess) Room(target Target) <-chan struct{} {
	reg := p.reg.Load()
	if in := reg.inboxes[target]; in != nil && !reg.closed {
		return in.Room()
	}
	return closedRoom()
}

// HasRoom implements RoomNotifier: the target inbox's HasRoom, or true
// for a target that is not (or no longer) registered.
func (p *InProcess) HasRoom(target Target) bool {
	reg := p.reg.Load()
	if in := reg.inboxes[target]; in != nil && !reg.closed {
		return in.HasRoom()
	}
	return true
}

// Close makes further Sends, Registers and Unregisters fail with ErrClosed
// and closes every inbox's Done, waking receivers; messages already accepted
// stay drainable. Idempotent.
func (p *InProcess) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.reg.Load()
	if old.closed {
		return
	}
	p.reg.Store(&registry{closed: true})
	for _, in := range old.inboxes {
		in.shut(inboxClosed)
	}
	p.logger.Debug("transport closed", zap.Int("targets", len(old.inboxes)))
}

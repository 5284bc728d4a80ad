package eventcollector

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/slots"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// Collector is the receiving end of one target: it registers dispatchers
// with the service, checks and applies their streams to a Sink, resets them
// when a stream breaks, and heartbeats their checkpoints. See the package
// documentation for the rules.
//
// Goroutines: Start starts the receive goroutine (the only caller of the
// Sink and the only reader of the inbox) and the heartbeat goroutine; Close
// stops both.
//
// Lock order: adminMu, then mu. No lock of the collector is held while the
// service or the sink is called, so a slow sink blocks neither heartbeats
// nor Stats, and the service may call anything while we call it.
type Collector struct {
	opts    Options
	log     *zap.Logger
	metrics *metrics
	cnt     counters
	closing chan struct{} // closed by Close: the goroutines stop
	// ctx is cancelled by Close: it ends the control-plane calls the
	// goroutines make on their own.
	ctx    context.Context
	cancel context.CancelFunc
	regs   registrationSource

	wg sync.WaitGroup

	// adminMu serialises AddDispatcher and RemoveDispatcher across their
	// service calls, so the service and mu.dispatchers agree on which
	// dispatchers exist whatever the interleaving.
	adminMu sync.Mutex

	mu struct {
		sync.Mutex
		started, closed bool
		// dispatchers maps IDs to dispatchers through the slot their
		// registration gave the service (RegisterRequest.Slot), which it
		// echoes in their resolved-ts: at a million dispatchers an index
		// is one cache line where a map probe on a 16-byte ID is several;
		// and its map holds slots, not pointers, so a GC cycle does not
		// visit a million dispatchers in hash order (slots.Index).
		dispatchers slots.Index[common.DispatcherID, *dispatcher]
		// due lists the dispatchers the next heartbeat tick must look at:
		// a checkpoint to report, or a reset to retry (dispatcher.due
		// says whether one is listed). Ticks cost what changed, never a
		// walk over every dispatcher.
		due []*dispatcher
		// sinkDone, if a RemoveDispatcher waits for a sink call in
		// progress (dispatcher.inSink), is closed when the calls of the
		// message being applied end.
		sinkDone chan struct{}
	}

	// async: the sink is an AsyncSink, whose checkpoints count once it
	// reports them durable.
	async bool

	// knobs are set by tests before Start; zero in production.
	knobs testingKnobs

	// batchBuf is the receive goroutine's scratch for a resolved-ts batch.
	batchBuf struct {
		list   []batchCall
		resets []batchReset
		calls  uint64 // sink calls made for batches, to sample their timing
		mark   uint64 // of the batch being applied (distinct)
		// touched is the last touch-ahead's sum (touchLocked): written
		// so the loads stay, never read.
		touched uint64
		cps     []SinkCheckpoint
		errs    []error
	}

	// hbBuf is the heartbeat goroutine's scratch lists: cps[i] is the
	// checkpoint of ds[i].
	hbBuf struct {
		cps   []messaging.DispatcherCheckpoint
		ds    []*dispatcher
		spare []*dispatcher // the due list's next backing array
		// touched keeps touchDueLocked's reads from being optimised away.
		touched uint64
	}
}

// testingKnobs are the collector's test hooks, all in one place: tests
// observe the goroutines at known points through them.
type testingKnobs struct {
	// afterHandle runs on the receive goroutine after each message was
	// handled (sink call and reset included).
	afterHandle func(m messaging.Message)
	// afterTick runs on the heartbeat goroutine after each round of
	// heartbeats and reset retries.
	afterTick func()
	// removeWaitsForSink runs in RemoveDispatcher when it is about to wait
	// for the dispatcher's sink call in flight.
	removeWaitsForSink func(id common.DispatcherID)
	// registration, if set, chooses AddDispatcher's registration ID
	// instead of the random source, so crafted messages can carry it.
	registration func(id common.DispatcherID) messaging.RegistrationID
}

// dispatcher is the collector's state of one registration of a
// dispatcher. Every field but id and reg is guarded by Collector.mu.
type dispatcher struct {
	id common.DispatcherID
	// reg is the registration's identity: only messages carrying it are
	// applied.
	reg messaging.RegistrationID
	st  stream
	// removed: dropped by RemoveDispatcher (or a failed AddDispatcher); a
	// goroutine that looked it up before must discard its results.
	removed bool
	// due: listed in Collector.mu.due.
	due bool
	// resetting: a Service.Reset call for it is in flight; another caller
	// leaves the reset to it.
	resetting bool
	// inSink: a sink call for it is in progress or about to start (set
	// with the verdict that asks for it, under mu, so a RemoveDispatcher
	// either sees it or prevents it).
	inSink bool
	// lastHeartbeat is the highest checkpoint the service accepted.
	lastHeartbeat common.Ts
	// slot is the dispatcher's index in Collector.mu.dispatchers; serviceSlot
	// the service's, from the last handshake accepted, echoed in
	// heartbeats.
	slot, serviceSlot uint32
	// batchMark is the mark of the last resolved-ts batch that named it
	// (see Collector.distinct); the receive goroutine's alone.
	batchMark uint64
}

// counters are the collector's statistics, read by Stats and the metrics
// without the lock.
type counters struct {
	received     [numKinds]atomic.Uint64
	rowsApplied  atomic.Uint64
	resets       [numResetReasons]atomic.Uint64
	ignored      [numIgnoreReasons]atomic.Uint64
	serviceCalls [numServiceCalls][numCallResults]atomic.Uint64
}

// numKinds is the number of message kinds (messaging.Kind starts at 1).
const numKinds = int(messaging.KindResolvedBatch)

// ignoreReason says why a message was dropped without effect.
type ignoreReason uint8

const (
	ignoreStaleEpoch        ignoreReason = iota // an epoch older than the current one
	ignoreStaleResolved                         // a resolved-ts overtaken by later messages
	ignoreUnknownDispatcher                     // not (or no longer) one of ours
	ignoreStaleRegistration                     // of another registration of the ID (one removed before)
	ignoreInvalidBatch                          // a resolved-ts batch of no entries or too many
	numIgnoreReasons
)

func (r ignoreReason) String() string {
	switch r {
	case ignoreStaleEpoch:
		return "stale_epoch"
	case ignoreStaleResolved:
		return "stale_resolved"
	case ignoreStaleRegistration:
		return "stale_registration"
	case ignoreInvalidBatch:
		return "invalid_batch"
	default:
		return "unknown_dispatcher"
	}
}

// New builds a collector. It starts nothing: call Start. Invalid options
// fail with an error wrapping ErrInvalidOptions; a metrics registration
// conflict with the registry's error.
func New(opts Options) (*Collector, error) {
	opts = opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	c := &Collector{
		opts:    opts,
		log:     opts.Logger.Named("eventcollector").With(zap.String("target", string(opts.Target))),
		closing: make(chan struct{}),
	}
	c.regs.seed()
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.mu.dispatchers.Reserve(opts.ExpectedDispatchers)
	if a, ok := opts.Sink.(AsyncSink); ok {
		c.async = true
		a.SetDurable(c.durable)
	}
	c.metrics = newMetrics(c)
	if err := c.metrics.register(opts.Registerer); err != nil {
		return nil, fmt.Errorf("eventcollector: register metrics: %w", err)
	}
	return c, nil
}

// Start starts the receive and heartbeat goroutines. A second Start is a
// no-op; Start after Close fails with ErrClosed. Dispatchers may be added
// before Start: their messages wait in the inbox.
func (c *Collector) Start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.mu.closed {
		return ErrClosed
	}
	if c.mu.started {
		return nil
	}
	c.mu.started = true
	// The ticker exists before Start returns, so a test's fake clock can
	// be advanced right away.
	ticker := c.opts.Clock.NewTicker(c.opts.HeartbeatInterval)
	c.wg.Go(c.runReceive)
	c.wg.Go(func() { c.runHeartbeats(ticker) })
	return nil
}

// Close stops the collector: (1) further calls fail with ErrClosed; (2)
// the goroutines are told to stop; the receive goroutine checks between
// messages, so it stops after at most the sink call in flight, which
// Close waits for (a sink call cannot be interrupted); (3) the metrics are
// unregistered. Messages left in the inbox are not applied. Close does not
// remove the dispatchers from the service: call RemoveDispatcher first if
// the service should forget them. Idempotent.
func (c *Collector) Close() error {
	c.mu.Lock()
	if c.mu.closed {
		c.mu.Unlock()
		return nil
	}
	c.mu.closed = true
	c.mu.Unlock()
	close(c.closing)
	c.cancel()
	c.wg.Wait()
	c.metrics.unregister(c.opts.Registerer)
	return nil
}

// AddDispatcher adds dispatcher id reading span from startTs (exclusive):
// it registers a new registration of id (an identity no earlier
// registration of id shares) with the service, whose stream starts at
// epoch 1. The collector's state exists before the service can send
// anything for it, and only messages of this registration are applied; if
// registration fails it is dropped again and the service's error is
// returned (wrapped). A dispatcher removed before may be added again (a
// table that moves back): messages of its earlier registration still in
// flight are ignored. Errors: ErrInvalidArgument, ErrDispatcherExists,
// ErrClosed, or the service's (messaging's control-plane sentinels).
func (c *Collector) AddDispatcher(ctx context.Context, id common.DispatcherID, span common.Span, startTs common.Ts) error {
	var errs []error
	if id.IsZero() {
		errs = append(errs, fmt.Errorf("%w: zero dispatcher id", ErrInvalidArgument))
	}
	if err := span.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrInvalidArgument, err))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	c.adminMu.Lock()
	defer c.adminMu.Unlock()
	c.mu.Lock()
	if c.mu.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	if _, ok := c.mu.dispatchers.Lookup(id); ok {
		c.mu.Unlock()
		return fmt.Errorf("%w: %v", ErrDispatcherExists, id)
	}
	reg := c.regs.next()
	if h := c.knobs.registration; h != nil {
		reg = h(id)
	}
	d := &dispatcher{id: id, reg: reg, st: newStream(startTs), lastHeartbeat: startTs}
	d.slot = c.mu.dispatchers.Add(d)
	c.mu.Unlock()

	err := c.opts.Service.Register(ctx, messaging.RegisterRequest{Dispatcher: id, Registration: d.reg, Span: span,
		StartTs: startTs, Target: c.opts.Target, Replace: c.opts.TakeOver, Slot: d.slot})
	if err != nil {
		c.mu.Lock()
		d.removed = true
		c.mu.dispatchers.Remove(d)
		c.mu.Unlock()
		return fmt.Errorf("eventcollector: register %v: %w", id, err)
	}
	c.log.Debug("dispatcher added", zap.Stringer("dispatcher", id), zap.Stringer("registration", d.reg),
		zap.Stringer("startTs", startTs))
	return nil
}

// lookupLocked finds the dispatcher a resolved-ts names: by its slot when
// the slot holds that ID (a service may echo any slot; it is a hint), by
// ID otherwise. The caller still checks the registration. REQUIRES: c.mu
// held.
func (c *Collector) lookupLocked(r *messaging.Resolved) *dispatcher {
	if d, ok := c.mu.dispatchers.At(r.Slot); ok && d.id == r.Dispatcher {
		return d
	}
	d, _ := c.mu.dispatchers.Lookup(r.Dispatcher)
	return d
}

// RemoveDispatcher ends dispatcher id's registration at the service, then
// drops its state. When it returns, (1) no send of the registration is in
// progress at the service and none will start (the service's Remove is a
// fence), (2) no sink call for it is in progress and none will start: a
// call in flight is waited for, bounded by ctx (an error wrapping
// ctx.Err() then says the state is dropped but the call still runs).
// Messages of the registration that arrive later are ignored. The state is
// dropped even if the service fails; a service that no longer has the
// registration (messaging.ErrUnknownDispatcher or ErrStaleRegistration) is
// not an error. Errors: ErrUnknownDispatcher (not ours), ErrClosed, or the
// service's.
func (c *Collector) RemoveDispatcher(ctx context.Context, id common.DispatcherID) error {
	c.adminMu.Lock()
	defer c.adminMu.Unlock()
	c.mu.Lock()
	if c.mu.closed {
		c.mu.Unlock()
		return ErrClosed
	}
	d, ok := c.mu.dispatchers.Lookup(id)
	c.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %v", ErrUnknownDispatcher, id)
	}
	err := c.opts.Service.Remove(ctx, messaging.RemoveRequest{Dispatcher: id, Registration: d.reg})
	c.mu.Lock()
	inSink := c.dropLocked(d)
	c.mu.Unlock()
	if inSink != nil {
		if h := c.knobs.removeWaitsForSink; h != nil {
			h(id)
		}
		select {
		case <-inSink:
		case <-ctx.Done():
			return fmt.Errorf("eventcollector: remove %v: a sink call is still in flight: %w", id, ctx.Err())
		}
	}
	if err != nil && !errors.Is(err, messaging.ErrUnknownDispatcher) && !errors.Is(err, messaging.ErrStaleRegistration) {
		return fmt.Errorf("eventcollector: remove %v: %w", id, err)
	}
	c.log.Debug("dispatcher removed", zap.Stringer("dispatcher", id), zap.Stringer("registration", d.reg))
	return nil
}

// dropLocked forgets d (its later messages are ignored, a goroutine
// that looked it up before discards its results) and returns the channel
// that closes when the sink call in progress for it ends, nil when none
// is. REQUIRES: c.mu held, c.adminMu held.
func (c *Collector) dropLocked(d *dispatcher) (inSink chan struct{}) {
	d.removed = true
	c.mu.dispatchers.Remove(d)
	if !d.inSink {
		return nil
	}
	if c.mu.sinkDone == nil {
		c.mu.sinkDone = make(chan struct{})
	}
	return c.mu.sinkDone
}

// DispatcherStatus is a snapshot of one dispatcher's receive state.
type DispatcherStatus struct {
	// Registration is the current registration's identity.
	Registration messaging.RegistrationID
	// Epoch is the current epoch (possibly not yet acknowledged by the
	// service: see PendingReset).
	Epoch uint64
	// StartTs is the start-ts of the current epoch.
	StartTs common.Ts
	// Checkpoint is the highest ts the sink confirmed.
	Checkpoint common.Ts
	// Resolved is the highest resolved-ts received in the current epoch.
	Resolved common.Ts
	// Resets counts the dispatcher's resets.
	Resets uint64
	// Handshaked: the current epoch's handshake was received.
	Handshaked bool
	// PendingReset: the service has not yet acknowledged the current epoch.
	PendingReset bool
	// LastHeartbeat is the highest checkpoint the service accepted.
	LastHeartbeat common.Ts
}

// Dispatcher returns a snapshot of dispatcher id, or ErrUnknownDispatcher.
func (c *Collector) Dispatcher(id common.DispatcherID) (DispatcherStatus, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.mu.dispatchers.Lookup(id)
	if !ok {
		return DispatcherStatus{}, fmt.Errorf("%w: %v", ErrUnknownDispatcher, id)
	}
	s := &d.st
	return DispatcherStatus{Registration: d.reg, Epoch: s.epoch, StartTs: s.startTs, Checkpoint: s.checkpoint, Resolved: s.resolved,
		Resets: s.resets, Handshaked: s.handshaked, PendingReset: s.needReset, LastHeartbeat: d.lastHeartbeat}, nil
}

// Checkpoints is Dispatcher's Checkpoint for many dispatchers under one
// lock: dst[i] is the checkpoint of ids[i] and known[i] whether it is
// registered here (dst[i] is 0 when not). A monitor that samples thousands
// of dispatchers at a time otherwise takes the collector's lock, which its
// receive and heartbeat goroutines take for every message, once per
// dispatcher. ids, dst and known have the same length; a caller should
// keep calls to a few hundred ids, the time the lock is held.
func (c *Collector) Checkpoints(ids []common.DispatcherID, dst []common.Ts, known []bool) {
	if len(dst) != len(ids) || len(known) != len(ids) {
		panic("eventcollector: Checkpoints with slices of different lengths")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, id := range ids {
		d, ok := c.mu.dispatchers.Lookup(id)
		dst[i], known[i] = 0, ok
		if ok {
			dst[i] = d.st.checkpoint
		}
	}
}

// Stats is a snapshot of the collector's counters.
type Stats struct {
	Dispatchers int
	// Messages counts messages received, by kind (index Kind-1).
	Messages [numKinds]uint64
	// RowsApplied counts rows the sink accepted (re-deliveries included).
	RowsApplied uint64
	// Resets counts resets by reason; index with a ResetReason.
	Resets [numResetReasons]uint64
	// StaleIgnored counts messages of an older epoch and resolved-ts
	// overtaken by later messages: ignored, as the protocol expects.
	StaleIgnored uint64
	// UnknownIgnored counts messages of dispatchers the collector does not
	// have (removed ones).
	UnknownIgnored uint64
	// StaleRegistrationIgnored counts messages of an earlier registration
	// of a dispatcher the collector has (removed and added again).
	StaleRegistrationIgnored uint64
	// PendingResets is the number of dispatchers whose current epoch the
	// service has not yet acknowledged.
	PendingResets int
	// Heartbeats counts checkpoints the service accepted.
	Heartbeats uint64
	// MinCheckpoint is the smallest checkpoint over dispatchers; zero when
	// there are none.
	MinCheckpoint common.Ts
}

// TotalResets returns the sum of Resets.
func (s Stats) TotalResets() uint64 {
	var n uint64
	for _, v := range s.Resets {
		n += v
	}
	return n
}

// Stats returns a snapshot; it walks every dispatcher (O(n)) for
// PendingResets and MinCheckpoint. Counters is the O(1) part.
func (c *Collector) Stats() Stats {
	st := c.Counters()
	c.mu.Lock()
	defer c.mu.Unlock()
	first := true
	for d := range c.mu.dispatchers.All() {
		if d.st.needReset {
			st.PendingResets++
		}
		if first || d.st.checkpoint < st.MinCheckpoint {
			st.MinCheckpoint = d.st.checkpoint
		}
		first = false
	}
	return st
}

// Counters returns the part of Stats that needs no walk over dispatchers
// (PendingResets and MinCheckpoint are left zero): cheap enough for a
// progress line sampled often at any number of dispatchers.
func (c *Collector) Counters() Stats {
	var st Stats
	for i := range st.Messages {
		st.Messages[i] = c.cnt.received[i].Load()
	}
	st.RowsApplied = c.cnt.rowsApplied.Load()
	for i := range st.Resets {
		st.Resets[i] = c.cnt.resets[i].Load()
	}
	st.StaleIgnored = c.cnt.ignored[ignoreStaleEpoch].Load() + c.cnt.ignored[ignoreStaleResolved].Load()
	st.UnknownIgnored = c.cnt.ignored[ignoreUnknownDispatcher].Load()
	st.StaleRegistrationIgnored = c.cnt.ignored[ignoreStaleRegistration].Load()
	st.Heartbeats = c.cnt.serviceCalls[callHeartbeat][resultOK].Load()
	c.mu.Lock()
	st.Dispatchers = c.mu.dispatchers.Len()
	c.mu.Unlock()
	return st
}

// dueLocked lists d for the next heartbeat tick, once. REQUIRES: c.mu held.
func (c *Collector) dueLocked(d *dispatcher) {
	if !d.due && !d.removed {
		d.due = true
		c.mu.due = append(c.mu.due, d)
	}
}

// isClosing reports whether Close was called.
func (c *Collector) isClosing() bool {
	select {
	case <-c.closing:
		return true
	default:
		return false
	}
}

// registrationSource hands out registration IDs: a random 64-bit base
// drawn at New, then one more per registration. Within a collector they
// never repeat (2^64 registrations); across collectors and restarts, the
// random base makes a collision of two registrations of the same
// dispatcher ID about as likely as guessing a 64-bit number. Choosing the
// identity here rather than at the service lets the collector recognise
// the registration's first message however early it arrives, and keeps
// identities unique across service restarts, which a service-side counter
// would not.
type registrationSource struct{ n atomic.Uint64 }

// seed draws the random base.
func (r *registrationSource) seed() { r.n.Store(rand.Uint64()) }

// next returns a fresh registration ID (never zero).
func (r *registrationSource) next() messaging.RegistrationID {
	for {
		if id := messaging.RegistrationID(r.n.Add(1)); !id.IsZero() {
			return id
		}
	}
}

// SlotKey is d's key in the collector's index (slots.Keyed).
func (d *dispatcher) SlotKey() common.DispatcherID { return d.id }

package upstream

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/slots"
	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
)

// Generator is a synthetic, deterministic workload and an Upstream that
// feeds it to subscribers as time passes.
//
// Invariants:
//   - The rows are a pure function of the options (see the package doc);
//     Rows, SpanRows and RowCount may be called at any time, from any
//     goroutine, for any range, and never depend on what was pushed.
//   - The frontier (ResolvedTs) only grows, by whole ticks, up to EndTs.
//   - Exactly one goroutine, the driver started by Start, calls sinks, and it
//     pushes a subscription's rows in order, each exactly once: its cursor
//     moves only after the sink accepted a batch.
//
// The driver keeps each subscription either in a ready list or filed under
// the tick it waits for (its next tick with rows or its next resolved-ts
// boundary), so a tick costs what is due, not the number of subscriptions:
// a million idle tables with a 1 s resolved interval cost a million pushes
// per second, not a hundred million visits. Ready subscriptions are served
// one after the other, each round giving each at most one chunk. A sink
// that blocks (back-pressure) therefore holds up all of them until it
// returns or Close cancels it; the store's write queue is shared, so that
// back-pressure is global anyway.
//
// Lock order: Generator.mu is never held while a sink is called. A
// subscription's eventstore.SinkGuard is held across its sink call and
// may be taken before Generator.mu (in Close), never after it.
type Generator struct {
	opts  GeneratorOptions // defaulted; StartTs resolved
	w     *workload
	log   *zap.Logger
	clock clock.Clock

	// ctx is the generator's lifetime: Close cancels it, which stops the
	// driver and cancels every in-flight Push (subscription contexts derive
	// from it), so Close is bounded even when a sink blocks.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// kick wakes the driver when a subscription is added, so a catch-up
	// starts without waiting for the next tick. Capacity 1: kicks coalesce.
	kick chan struct{}

	// knobs are set by tests before Start; zero in production.
	knobs testingKnobs

	// Single-word counters, read by Stats without a lock.
	rowsGenerated atomic.Uint64
	rowsPushed    atomic.Uint64
	batches       atomic.Uint64
	pushErrors    atomic.Uint64

	// sched and pushCtx are the driver's: only the driver goroutine
	// touches them. pushCtx (a child of ctx) is the context of every push;
	// a subscription's Close cancels it when that subscription's push is in
	// flight, and the driver then makes a new one.
	sched      schedule
	pushCtx    context.Context
	pushCancel context.CancelFunc

	mu struct {
		sync.Mutex
		started, closed bool
		// subs holds the live subscriptions by ID (IDs grow in creation
		// order), through slots: its map holds no pointers for a GC cycle
		// to visit (slots.Index).
		subs slots.Index[subKey, *genSub]
		// added holds subscriptions the driver has not scheduled yet.
		added    []*genSub
		nextID   uint64
		frontier common.Ts
	}
}

// schedule is the driver's timing wheel: buckets[k] holds the
// subscriptions that have nothing to do until tick k has elapsed; ready
// holds those to feed now. done is the last tick whose bucket was taken.
type schedule struct {
	done int64
	// announced is the last frontier given to OnFrontier.
	announced common.Ts
	buckets   map[int64][]*genSub
	ready     []*genSub
	spare     []*genSub
	// retry holds the subscriptions whose push failed (or was cancelled
	// by another subscription's Close): the next pass feeds them again.
	// Not a bucket of the next tick: once the frontier stops at EndTs no
	// later tick elapses, and a retry filed there was never taken, leaving
	// the subscription short of the end for good.
	retry []*genSub
	// adv is the round's subscriptions whose feed is only a resolved-ts
	// advance, with the cursor each reaches: they are pushed together
	// (flushAdvances). advGuards, advErrs and pusher are its scratch.
	adv       []pendingAdvance
	advGuards []*eventstore.SinkGuard
	advErrs   []error
	pusher    eventstore.ResolvedPusher
	// free holds emptied bucket slices for reuse: at a million
	// subscriptions every one is refiled once a resolved interval, and
	// buckets grown from nil each time would cost growslice and garbage.
	free [][]*genSub
	// touched is the last touch-ahead's sum (touch): written so the
	// loads stay, never read.
	touched uint64
}

// touch reads a word of each line a feed of ss reads first (internal/
// touchahead): the subscription's first line, its guard and its progress.
// It only reads.
func (sc *schedule) touch(ss []*genSub) {
	var t uint64
	for _, s := range ss {
		t += s.id + s.resolved.Load()
		s.guard.IsClosed()
		s.sinkClosed.Load()
	}
	sc.touched = t
}

var _ eventstore.Upstream = (*Generator)(nil)

// testingKnobs are the generator's test hooks, all in one place: tests
// set them before Start; in production they are zero and each costs one
// comparison. Each runs on the driver goroutine.
type testingKnobs struct {
	// pass runs at the end of every pass of the driver.
	pass func(passInfo)
	// arming runs after the driver has computed its next wait and before
	// it arms the timer with it: a test moves the clock there to hold
	// that gap open.
	arming func()
	// tickGenerated runs each time the driver generated one tick's rows
	// of one subscription.
	tickGenerated func()
}

// passInfo describes one round of the driver over its ready list, for
// tests (testingKnobs.pass).
type passInfo struct {
	frontier common.Ts
	// more is true when some subscription has work left below frontier.
	more bool
}

// NewGenerator validates opts and returns a Generator. It starts nothing;
// call Start to begin pushing to subscribers.
func NewGenerator(opts GeneratorOptions) (*Generator, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	o := opts.EnsureDefaults()
	if o.StartTs == 0 {
		tickMs := o.Tick.Milliseconds()
		if k := o.Clock.Now().UnixMilli() / tickMs; k > 0 {
			o.StartTs = common.ComposeTs(k*tickMs, 0) - 1
		}
		if o.EndTs != 0 && o.EndTs <= o.StartTs {
			return nil, fmt.Errorf("%w: EndTs %v is not after the default StartTs %v", ErrInvalidOptions, o.EndTs, o.StartTs)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := &Generator{
		opts:   o,
		w:      newWorkload(o),
		log:    o.Logger.Named("upstream.generator"),
		clock:  o.Clock,
		ctx:    ctx,
		cancel: cancel,
		kick:   make(chan struct{}, 1),
	}
	g.pushCtx, g.pushCancel = context.WithCancel(ctx)
	g.mu.frontier = o.StartTs
	g.sched.done = g.w.tickOf(o.StartTs)
	g.sched.announced = o.StartTs // nothing is fed at or below it
	g.sched.buckets = make(map[int64][]*genSub)
	return g, nil
}

// Options returns the options in effect: defaults applied and StartTs
// resolved. A Generator built from them produces the same rows.
func (g *Generator) Options() GeneratorOptions { return g.opts }

// Rows returns exactly the rows of table tableID with commit-ts in
// (start, end], in (commit-ts, start-ts, key) order; nil for a table outside
// 1..Tables or an empty range. Its cost is proportional to the rows, plus
// one per tick of a dense table or per block of a sparse one (see the
// package doc), in the range clamped to the workload's (StartTs, EndTs].
func (g *Generator) Rows(tableID int64, start, end common.Ts) []common.Row {
	return g.w.rows(tableID, start, end, nil)
}

// SpanRows is Rows limited to the keys inside span.
func (g *Generator) SpanRows(span common.Span, start, end common.Ts) []common.Row {
	if span.IsWholeTable() {
		return g.w.rows(span.TableID, start, end, nil)
	}
	return g.w.rows(span.TableID, start, end, &span)
}

// RowCount returns len(Rows(tableID, start, end)) without generating keys or
// values: ticks entirely inside the range cost one hash each.
func (g *Generator) RowCount(tableID int64, start, end common.Ts) int {
	return g.w.rowCount(tableID, start, end)
}

// ResolvedTs returns the frontier: every row with commit-ts <= it belongs to
// an elapsed tick. It starts at StartTs and only grows, up to EndTs.
func (g *Generator) ResolvedTs() common.Ts {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.mu.frontier
}

// Subscribe registers a feed of span from startTs: the driver pushes the
// span's rows with commit-ts > startTs (catching up first if startTs is in
// the past), then follows the frontier. It never calls the sink itself.
func (g *Generator) Subscribe(span common.Span, startTs common.Ts, sink eventstore.Sink) (eventstore.Subscription, error) {
	if sink == nil {
		return nil, fmt.Errorf("%w: nil sink", ErrInvalidArgument)
	}
	if err := span.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	if !g.w.validTable(span.TableID) {
		return nil, fmt.Errorf("%w: table %d is outside 1..%d", ErrUnknownTable, span.TableID, g.w.tables)
	}
	s := &genSub{
		g:       g,
		span:    common.Pack(cloneSpan(span)),
		startTs: startTs,
		lo:      max(startTs, g.w.startTs),
	}
	s.guard.Init(sink)
	if !span.IsWholeTable() {
		f := s.span.Span()
		s.filter = &f
	}
	s.cur.tick = g.w.tickOf(s.lo)
	s.cacheTick = noCacheTick
	s.resolved.Store(uint64(startTs))

	g.mu.Lock()
	if g.mu.closed {
		g.mu.Unlock()
		s.guard.Close()
		return nil, ErrClosed
	}
	g.mu.nextID++
	s.id = g.mu.nextID
	g.mu.subs.Add(s)
	g.mu.added = append(g.mu.added, s)
	g.mu.Unlock()

	select {
	case g.kick <- struct{}{}:
	default:
	}
	return s, nil
}

// SetEndTs bounds the workload at end, for a caller that learns its end
// only after subscribing (cdcserver starts a run's clock once its
// dispatchers are registered). It must be called before Start and not
// concurrently with Rows, SpanRows or RowCount; it fails with
// ErrAlreadyStarted after Start and ErrInvalidOptions unless end is after
// StartTs and no later than an EndTs already set.
func (g *Generator) SetEndTs(end common.Ts) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.mu.started || g.mu.closed {
		return ErrAlreadyStarted
	}
	if end <= g.opts.StartTs || end > g.w.endTs {
		return fmt.Errorf("%w: EndTs %v is not in (StartTs %v, %v]", ErrInvalidOptions, end, g.opts.StartTs, g.w.endTs)
	}
	g.opts.EndTs, g.w.endTs = end, end
	return nil
}

// Start starts the driver goroutine. It fails with ErrAlreadyStarted on a
// second call and ErrClosed after Close.
func (g *Generator) Start() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.mu.closed {
		return ErrClosed
	}
	if g.mu.started {
		return ErrAlreadyStarted
	}
	g.mu.started = true
	g.wg.Go(g.run)
	return nil
}

// Close stops the generator and waits for the driver to exit. It is
// idempotent and bounded even when a sink blocks, provided the sink honours
// its context. Subscriptions need not be closed first; closing them later
// is harmless.
func (g *Generator) Close() {
	// 1. Refuse new subscriptions and a late Start.
	g.mu.Lock()
	g.mu.closed = true
	g.mu.Unlock()
	// 2. Stop the driver and cancel any Push in flight.
	g.cancel()
	// 3. Wait for the driver; after this no sink is called again.
	g.wg.Wait()
}

// Stats is a snapshot of a Generator's counters.
type Stats struct {
	// Frontier is ResolvedTs().
	Frontier common.Ts
	// RowsGenerated counts rows the driver materialised (a retried chunk
	// is generated again). Calls to Rows are not counted.
	RowsGenerated uint64
	// RowsPushed and Batches count what sinks accepted.
	RowsPushed uint64
	Batches    uint64
	// PushErrors counts pushes that failed with an error other than
	// context cancellation or eventstore.ErrClosed.
	PushErrors uint64
	// Subscriptions lists the live subscriptions in creation order.
	Subscriptions []SubscriptionStats
}

// SubscriptionStats describes the progress of one live subscription.
type SubscriptionStats struct {
	ID      uint64
	Span    common.Span
	StartTs common.Ts
	// ResolvedTs is the last resolved-ts the sink accepted (StartTs until
	// the first).
	ResolvedTs common.Ts
	// Lag is how far ResolvedTs (or the workload's StartTs, if later)
	// trails the generator's frontier, in physical time.
	Lag        time.Duration
	RowsPushed uint64
	Batches    uint64
	PushErrors uint64
	// SinkClosed is true once the sink returned eventstore.ErrClosed; the
	// driver then stops feeding it.
	SinkClosed bool
}

// Stats returns a snapshot of the counters.
func (g *Generator) Stats() Stats {
	g.mu.Lock()
	frontier := g.mu.frontier
	subs := slices.Collect(g.mu.subs.All())
	g.mu.Unlock()
	slices.SortFunc(subs, func(a, b *genSub) int { return cmp.Compare(a.id, b.id) })
	st := Stats{
		Frontier:      frontier,
		RowsGenerated: g.rowsGenerated.Load(),
		RowsPushed:    g.rowsPushed.Load(),
		Batches:       g.batches.Load(),
		PushErrors:    g.pushErrors.Load(),
	}
	for _, s := range subs {
		resolved := common.Ts(s.resolved.Load())
		// Nothing exists at or below the workload's StartTs, so a
		// subscription from an older start-ts is no further behind than that.
		effective := max(resolved, g.w.startTs)
		lag := time.Duration(frontier.PhysicalMs()-effective.PhysicalMs()) * time.Millisecond
		st.Subscriptions = append(st.Subscriptions, SubscriptionStats{
			ID:         s.id,
			Span:       cloneSpan(s.span.Span()),
			StartTs:    s.startTs,
			ResolvedTs: resolved,
			Lag:        max(lag, 0),
			RowsPushed: s.rowsPushed.Load(),
			Batches:    s.batches.Load(),
			PushErrors: s.pushErrors.Load(),
			SinkClosed: s.sinkClosed.Load(),
		})
	}
	return st
}

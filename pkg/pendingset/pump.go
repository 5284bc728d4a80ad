package pendingset

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/clock"
)

// DeliverFunc sends one batch to the target. Returning a non-nil error
// fails the whole batch (every key kept, no budget spent, the pump backs
// off); returning nil applies each entry's Result, which the function sets
// in place (the zero value is Delivered). It runs on the pump's goroutine,
// never concurrently with itself, and must return promptly once ctx is
// cancelled: Stop waits for it.
type DeliverFunc[K comparable, V any] func(ctx context.Context, batch []Entry[K, V]) error

// Pump runs the drain-deliver-complete loop of one Set on one goroutine
// (delivering from up to Options.MaxInFlight goroutines of its own when
// that is above one).
// NewPump starts nothing; Start starts the goroutine; Stop or Drain stops
// it. A set normally has one pump; several are safe (Drain never hands a
// key to two of them) but share one doorbell.
//
// INVARIANTS: the goroutine runs between Start and the close of doneCh, and
// only Stop (directly or through Drain) makes it exit before drain mode
// has settled. After Stop returns no key is in flight on this pump's
// behalf: the interrupted batch was completed as a whole-batch failure.
//
// LOCK ORDER: Pump.mu is taken alone; it is never held while calling into
// the Set or deliver.
type Pump[K comparable, V any] struct {
	set     *Set[K, V]
	deliver DeliverFunc[K, V]
	log     *zap.Logger

	stopCh  chan struct{} // closed by Stop: exit now
	wakeCh  chan struct{} // Wake's token: end a back-off wait early
	drainCh chan struct{} // closed by Drain: exit once settled
	quietCh chan struct{} // closed by the goroutine when drain mode settled
	doneCh  chan struct{} // closed when the goroutine exits
	wg      sync.WaitGroup

	// leftQuarantined is written by the goroutine before it closes quietCh
	// and read only after quietCh is closed.
	leftQuarantined int

	stopOnce, drainOnce sync.Once

	// knobs are set by tests before Start; zero in production.
	knobs testingKnobs

	mu struct {
		sync.Mutex
		started, stopped bool
		cancel           context.CancelFunc // cancels deliver's context
	}
}

// testingKnobs are the pump's test hooks, all in one place: tests set
// them before Start; in production they are zero and each costs one
// comparison.
type testingKnobs struct {
	// drainWaits runs when Drain has requested drain mode and is about to
	// wait for the set to settle, the goroutine to exit or ctx to end.
	drainWaits func()
}

// NewPump returns a pump for s that delivers with deliver. It starts
// nothing.
func NewPump[K comparable, V any](s *Set[K, V], deliver DeliverFunc[K, V]) (*Pump[K, V], error) {
	if s == nil || deliver == nil {
		return nil, fmt.Errorf("%w: NewPump needs a Set and a DeliverFunc", ErrInvalidArgument)
	}
	return &Pump[K, V]{
		set:     s,
		deliver: deliver,
		log:     s.log.Named("pump"),
		stopCh:  make(chan struct{}),
		wakeCh:  make(chan struct{}, 1),
		drainCh: make(chan struct{}),
		quietCh: make(chan struct{}),
		doneCh:  make(chan struct{}),
	}, nil
}

// Start starts the pump's single goroutine. It returns ErrAlreadyStarted
// on a second call and ErrStopped after Stop; a pump is not restartable
// (make a new one for the same Set).
func (p *Pump[K, V]) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.mu.stopped:
		return ErrStopped
	case p.mu.started:
		return ErrAlreadyStarted
	}
	p.mu.started = true
	ctx, cancel := context.WithCancel(context.Background())
	p.mu.cancel = cancel
	p.wg.Go(func() { p.run(ctx) })
	return nil
}

// Stop stops the pump now: it cancels the context of an in-flight delivery,
// whose batch then merges back as a whole-batch failure, and returns after
// the goroutine exited. Queued keys stay in the Set, undelivered; Add keeps
// working and simply records them. Stop is idempotent and safe to call
// concurrently with Drain or before Start.
func (p *Pump[K, V]) Stop() {
	p.mu.Lock()
	p.mu.stopped = true
	cancel := p.mu.cancel
	p.mu.Unlock()
	// 1. Tell the loop to exit at its next check or wait.
	p.stopOnce.Do(func() { close(p.stopCh) })
	// 2. Cancel an in-flight delivery.
	if cancel != nil {
		cancel()
	}
	// 3. Wait for the goroutine.
	p.wg.Wait()
}

// Drain delivers everything, then stops: it waits until no key is ready,
// in flight or backing off (keys added meanwhile included; Add is never
// refused), or until ctx is done. Either way the pump is stopped when Drain
// returns. It returns nil when the set settled with nothing quarantined, an
// error wrapping ErrQuarantined when quarantined keys remain (they are not
// waited for: they are known to fail), ctx.Err() at the deadline,
// ErrStopped if Stop intervened, and ErrNotStarted before Start.
func (p *Pump[K, V]) Drain(ctx context.Context) error {
	p.mu.Lock()
	started := p.mu.started
	p.mu.Unlock()
	if !started {
		return ErrNotStarted
	}
	p.drainOnce.Do(func() { close(p.drainCh) })
	if k := p.knobs.drainWaits; k != nil {
		k()
	}
	select {
	case <-p.quietCh:
	case <-p.doneCh:
	case <-ctx.Done():
	}
	p.Stop()
	// The goroutine has exited, so quietCh's state is final.
	select {
	case <-p.quietCh:
		if p.leftQuarantined > 0 {
			return fmt.Errorf("%w: %d keys", ErrQuarantined, p.leftQuarantined)
		}
		return nil
	default:
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return ErrStopped
}

// run is the pump's goroutine: drain a batch, deliver it, complete it; back
// off after a whole-batch failure; when nothing is ready, wait for the
// doorbell, the next backoff deadline, a drain request or Stop. With
// Options.MaxInFlight n > 1 it hands up to n batches at once to delivery
// goroutines it starts and waits for before it exits; batches in flight
// hold disjoint keys (Drain never hands out a key in flight), so each key's
// deliveries stay in order.
func (p *Pump[K, V]) run(ctx context.Context) {
	defer close(p.doneCh)
	clk := p.set.opts.Clock
	n := p.set.opts.MaxInFlight
	var workers sync.WaitGroup
	defer workers.Wait() // after Stop's cancel: they finish promptly
	results := make(chan flight[K, V], n)
	var spare [][]Entry[K, V]
	inflight := 0
	failures := 0 // consecutive whole-batch failures
	draining := false
	drainC := (<-chan struct{})(p.drainCh)
	// settle records a delivery's outcome and reports whether the pump
	// must back off (false: stopped during the back-off).
	settle := func(err error) bool {
		if err == nil {
			failures = 0
			select { // a Wake meant for a back-off that did not happen
			case <-p.wakeCh:
			default:
			}
			return true
		}
		failures++
		d := p.set.backoff(failures)
		logf := p.log.Warn
		if errors.Is(err, ErrBusy) {
			logf = p.log.Debug // routine back-pressure
		}
		logf("batch delivery failed; backing off", zap.Error(err),
			zap.Int("consecutive_failures", failures), zap.Duration("backoff", d))
		return p.sleep(d)
	}
	for {
		select {
		case <-p.stopCh:
			return
		default:
		}
		// Outcomes of concurrent deliveries that finished.
		for collected := true; collected && inflight > 0; {
			select {
			case f := <-results:
				inflight--
				spare = append(spare, f.batch)
				if !settle(f.err) {
					return
				}
			default:
				collected = false
			}
		}
		if inflight < n {
			var batch []Entry[K, V]
			if k := len(spare); k > 0 {
				batch, spare = spare[k-1], spare[:k-1]
			}
			batch = p.set.Drain(0, batch[:0])
			if len(batch) > 0 {
				if n == 1 {
					err := p.deliverBatch(ctx, batch, failures)
					clear(batch) // drop references to keys and values
					spare = append(spare, batch)
					if !settle(err) {
						return
					}
					continue
				}
				inflight++
				streak := failures // read here: settle writes failures while the worker runs
				workers.Go(func() {
					err := p.deliverBatch(ctx, batch, streak)
					clear(batch)
					results <- flight[K, V]{batch: batch, err: err}
				})
				continue
			}
			spare = append(spare, batch)
		}
		if draining && inflight == 0 {
			if ok, q := p.set.settled(); ok {
				p.leftQuarantined = q
				close(p.quietCh)
				return
			}
		}
		var timerC <-chan time.Time
		var timer clock.Timer
		if due, ok := p.set.NextDue(); ok && inflight < n {
			timer = clk.NewTimer(max(due.Sub(clk.Now()), 0))
			timerC = timer.C()
		}
		var doorbell <-chan struct{}
		if inflight < n {
			doorbell = p.set.doorbell
		}
		var resultC <-chan flight[K, V]
		if inflight > 0 {
			resultC = results
		}
		stop := false
		select {
		case <-p.stopCh:
			stop = true
		case <-doorbell:
		case <-timerC:
		case f := <-resultC:
			inflight--
			spare = append(spare, f.batch)
			stop = !settle(f.err)
		case <-drainC:
			draining, drainC = true, nil
		}
		if timer != nil {
			timer.Stop()
		}
		if stop {
			return
		}
	}
}

// flight is the outcome of one concurrent delivery.
type flight[K comparable, V any] struct {
	batch []Entry[K, V]
	err   error
}

// deliverBatch delivers batch and completes it. A whole-batch failure that
// is permanent, or the BisectAfter-th in a row (busy targets excepted), is
// not retried as a whole: the batch is bisected (isolate). It returns the
// error the pump backs off for: nil when every part was completed one way
// or another, the whole-batch error of a part that was merged back
// otherwise.
func (p *Pump[K, V]) deliverBatch(ctx context.Context, batch []Entry[K, V], failures int) error {
	err := p.deliverOnce(ctx, batch)
	if err == nil || ctx.Err() != nil || !p.bisects(err, failures+1) {
		p.complete(batch, err)
		return err
	}
	return p.isolate(ctx, batch, err)
}

// deliverOnce calls deliver, bounded by Options.DeliveryTimeout when it is
// set: a timer on the set's clock cancels the call's context, and the
// failure then wraps ErrDeliveryTimeout.
func (p *Pump[K, V]) deliverOnce(ctx context.Context, batch []Entry[K, V]) error {
	d := p.set.opts.DeliveryTimeout
	if d <= 0 {
		return p.deliver(ctx, batch)
	}
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	t := p.set.opts.Clock.NewTimer(d)
	done := make(chan struct{})
	var watch sync.WaitGroup
	watch.Go(func() {
		select {
		case <-t.C():
			cancel()
		case <-done:
			t.Stop()
		}
	})
	err := p.deliver(dctx, batch)
	close(done)
	watch.Wait()
	if err != nil && ctx.Err() == nil && dctx.Err() != nil {
		return fmt.Errorf("%w after %v: %w", ErrDeliveryTimeout, d, err)
	}
	return err
}

// bisects reports whether a whole-batch failure err, the n-th in a row,
// is bisected rather than retried as a whole.
func (p *Pump[K, V]) bisects(err error, n int) bool {
	if errors.Is(err, ErrPermanent) {
		return true
	}
	after := p.set.opts.BisectAfter
	return after > 0 && n >= after && !errors.Is(err, ErrBusy)
}

// isolate handles batch, whose delivery failed with cause: a single entry
// is completed as FailedKey (permanent cause) or RetryKey; a larger batch
// is split in two halves, each delivered on its own and, if it fails in a
// way that bisects, isolated in turn. Every other key is delivered, and a
// half that fails transiently (or as busy) merges back as a whole. A
// permanent batch of n entries with k bad keys costs O(k log n) deliveries.
func (p *Pump[K, V]) isolate(ctx context.Context, batch []Entry[K, V], cause error) error {
	if len(batch) == 1 {
		if errors.Is(cause, ErrPermanent) {
			batch[0].Result = FailedKey
		} else {
			batch[0].Result = RetryKey
		}
		p.log.Warn("a key fails on its own; isolated from its batch", zap.Stringer("result", batch[0].Result), zap.Error(cause))
		p.complete(batch, nil)
		return nil
	}
	p.set.noteBisection()
	mid := len(batch) / 2
	var errs []error
	for _, half := range [][]Entry[K, V]{batch[:mid], batch[mid:]} {
		if err := ctx.Err(); err != nil {
			p.complete(half, err) // stopping: merge back
			errs = append(errs, err)
			continue
		}
		for i := range half {
			half[i].Result = Delivered // the failed attempt may have set some
		}
		err := p.deliverOnce(ctx, half)
		switch {
		case err == nil:
			p.complete(half, nil)
		case ctx.Err() == nil && (errors.Is(err, ErrPermanent) || (!errors.Is(cause, ErrPermanent) && !errors.Is(err, ErrBusy))):
			// Still failing the way that bisects: look closer.
			if ierr := p.isolate(ctx, half, err); ierr != nil {
				errs = append(errs, ierr)
			}
		default:
			p.complete(half, err) // transient: merge back and back off
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// complete completes batch, logging what only a misbehaving deliverer
// causes (an unknown Result, overwritten entries).
func (p *Pump[K, V]) complete(batch []Entry[K, V], err error) {
	if cerr := p.set.Complete(batch, err); cerr != nil {
		p.log.Error("completing a batch", zap.Error(cerr))
	}
}

// sleep waits d, or until Wake or Stop, and reports whether it was not
// stopped.
func (p *Pump[K, V]) sleep(d time.Duration) bool {
	t := p.set.opts.Clock.NewTimer(d)
	select {
	case <-t.C():
		return true
	case <-p.wakeCh:
		t.Stop()
		return true
	case <-p.stopCh:
		t.Stop()
		return false
	}
}

// Wake ends the pump's current back-off wait after a whole-batch failure,
// so the batch is retried at once: the caller learned that the target has
// room again (messaging.RoomNotifier, say). It never blocks; a Wake while
// the pump is not backing off ends its next back-off wait at once.
func (p *Pump[K, V]) Wake() {
	select {
	case p.wakeCh <- struct{}{}:
	default:
	}
}

// noteBisection counts a failing batch split in two.
func (s *Set[K, V]) noteBisection() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.stats.Bisections++
}

// backoff is the delay after the n-th consecutive whole-batch failure.
func (s *Set[K, V]) backoff(n int) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.backoffLocked(n)
}

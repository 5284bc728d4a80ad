package eventservice

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/slots"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// Service is the event service: it owns the dispatchers' scan scheduling,
// from the store's notifications to messages on the transport. See the
// package documentation for the pipeline and its invariants.
//
// Lock order: Service.mu, then dispatcher.mu, then a prepareQueue's or the
// schema-blocked set's mutex. The notify path takes none of the first two.
type Service struct {
	opts    Options
	log     *zap.Logger
	metrics *metrics

	prepQueues []*prepareQueue
	scanCh     chan *session
	closing    chan struct{} // closed when workers must stop
	closed     atomic.Bool   // set first thing in Close: the notify gate
	wg         sync.WaitGroup
	// stopping counts targets being stopped by forget; Close waits for them.
	stopping sync.WaitGroup

	counters []workerCounters // indexed by preparation worker
	blocked  *blockedSet
	backoff  *dueTimers[*session]
	// registrar retries the store re-registrations of resets that failed
	// (control-plane work: see Reset).
	registrar *dueTimers[*dispatcher]
	kaSet     keepaliveSet
	// heartbeatBufs pools Heartbeat's per-call dispatcher slices
	// (*[]*dispatcher).
	heartbeatBufs sync.Pool

	// scanPending counts sessions in scanQueued (in the channel or waiting
	// to enter it).
	scanPending atomic.Int64
	resets      atomic.Uint64
	// scannedRows and scannedBytes count what scans read (also exported
	// as metrics), for Progress.
	scannedRows, scannedBytes atomic.Uint64

	mu struct {
		sync.RWMutex
		started bool
		closed  bool
		// dispatchers maps IDs to dispatchers through the slot their
		// handshakes carry, which collectors echo in heartbeats: an index
		// is one cache line where a map probe on a 16-byte ID is several,
		// at a million checkpoints a second; and its map holds slots, not
		// pointers, so a GC cycle does not visit a million dispatchers in
		// hash order (slots.Index). Bounded by MaxDispatchers.
		dispatchers slots.Index[common.DispatcherID, *dispatcher]
		targets     map[messaging.Target]*target
		// spanKeyBytes is the span keys' bytes of the registered
		// dispatchers, bounded by Options.MaxSpanKeyBytes.
		spanKeyBytes int64
	}
	schemaCancel func()

	// clockBase is the clock's reading at New: published progress records
	// its time as an offset from it (sinceBase), one atomic word.
	clockBase time.Time
	// kaCarry is the keepalive round's scratch list of carried-over
	// sessions (only the keepalive goroutine uses it).
	kaCarry []*session

	// knobs are set by tests before Start; zero in production.
	knobs testingKnobs
}

// New builds a service. It starts no goroutine: call Start.
func New(opts Options) (*Service, error) {
	opts = opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	svc := &Service{
		opts:     opts,
		log:      opts.Logger.Named("eventservice"),
		scanCh:   make(chan *session, opts.ScanQueueSize),
		closing:  make(chan struct{}),
		counters: make([]workerCounters, opts.PrepareWorkers),
	}
	// One nanosecond before now, so that no offset is 0 ("never").
	svc.clockBase = opts.Clock.Now().Add(-time.Nanosecond)
	svc.mu.dispatchers.Reserve(opts.ExpectedDispatchers)
	svc.mu.targets = make(map[messaging.Target]*target)
	svc.prepQueues = make([]*prepareQueue, opts.PrepareWorkers)
	for i := range svc.prepQueues {
		svc.prepQueues[i] = newPrepareQueue()
	}
	svc.blocked = newBlockedSet()
	svc.kaSet.gen.Store(1) // a new session's kaGen, 0, is in no list
	svc.backoff = newDueTimers[*session](opts.Clock)
	svc.registrar = newDueTimers[*dispatcher](opts.Clock)
	svc.metrics = newMetrics(svc)
	if err := svc.metrics.register(opts.Registerer); err != nil {
		return nil, fmt.Errorf("eventservice: register metrics: %w", err)
	}
	return svc, nil
}

// Start starts the preparation and scan workers, the schema-retry loop and
// the back-off timer loop. It returns ErrClosed after Close; a second Start
// is a no-op.
func (svc *Service) Start() error {
	svc.mu.Lock()
	defer svc.mu.Unlock()
	if svc.mu.closed {
		return ErrClosed
	}
	if svc.mu.started {
		return nil
	}
	svc.mu.started = true
	svc.schemaCancel = svc.opts.Schema.Subscribe(func(common.Ts) { svc.blocked.ring() })
	for i := range svc.prepQueues {
		svc.wg.Go(func() { svc.runPrepareWorker(i) })
	}
	for range svc.opts.ScanWorkers {
		svc.wg.Go(svc.runScanWorker)
	}
	svc.wg.Go(svc.runSchemaRetry)
	svc.wg.Go(func() { svc.backoff.run(svc.closing, svc.backoffExpired) })
	svc.wg.Go(func() { svc.registrar.run(svc.closing, svc.retryStoreRegistration) })
	// The ticker exists before Start returns, so a test's fake clock can be
	// advanced right away.
	keepaliveTicker := svc.opts.Clock.NewTicker(svc.opts.SignalInterval)
	svc.wg.Go(func() { svc.runKeepalive(keepaliveTicker) })
	for _, t := range svc.mu.targets {
		if err := t.start(); err != nil {
			return err
		}
	}
	return nil
}

// forget deletes d from the dispatcher map if it is still the entry of its
// ID (a newer dispatcher of the same ID is left alone). The last
// dispatcher of a target takes the target with it: its pump is stopped
// (outside Service.mu, which a delivery in flight takes) and its metrics
// unregistered. Close stops the targets that remain.
func (svc *Service) forget(d *dispatcher) {
	var idle *target
	svc.mu.Lock()
	if svc.mu.dispatchers.Remove(d) {
		svc.mu.spanKeyBytes -= spanKeyBytes(d.span.Span())
		t := d.target
		t.dispatchers--
		if t.dispatchers == 0 && !svc.mu.closed && svc.mu.targets[t.name] == t {
			delete(svc.mu.targets, t.name)
			idle = t
		}
	}
	if idle != nil {
		// The metrics go now, under Service.mu like their registration in
		// targetLocked, so a Register of the same target right after this
		// can register its own; the pump is stopped outside the lock (a
		// delivery in flight takes it), and Close waits for that.
		idle.resolved.Unregister()
		svc.stopping.Add(1)
	}
	svc.mu.Unlock()
	if idle != nil {
		if k := svc.knobs.targetStopping; k != nil {
			k(idle.name)
		}
		idle.stopWorkers()
		svc.stopping.Done()
	}
}

// retire removes session s: it leaves every queue and set it is in, and an
// owner that holds it discards its results.
func (svc *Service) retire(s *session) {
	act, _ := s.sched.fire(evRemove)
	if act != actRemoved {
		return
	}
	svc.prepQueues[s.d.worker].unlink(s)
	svc.blocked.remove(s)
}

// request asks for preparation of s. It is O(1), lock-free except for the
// queue's short mutex, and never blocks.
func (svc *Service) request(s *session, fromNotify bool) {
	act, _ := s.sched.fire(evRequest)
	c := &svc.counters[s.d.worker]
	if fromNotify {
		c.notifications.Add(1)
	}
	switch act {
	case actEnqueuePrepare:
		svc.prepQueues[s.d.worker].push(s)
	case actNone, actPending:
		if fromNotify {
			c.coalesced.Add(1)
		}
	}
}

// unregisterOnClose ends d's store registration unless a Remove did. d.mu
// (which waits for a Register still registering d in the store) is
// released by defer: the store is the embedder's code.
func (svc *Service) unregisterOnClose(d *dispatcher) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.mu.removed {
		return nil
	}
	return svc.unregisterLocked(d)
}

// enqueue pushes s onto its preparation queue after a transition asked for
// it.
func (svc *Service) enqueue(s *session) { svc.prepQueues[s.d.worker].push(s) }

// Close stops the service: (1) new registrations and notifications are
// refused; (2) every dispatcher is unregistered from the store, which waits
// for its in-flight callback; (3) the workers are told to stop (every wait
// inside them also watches this) and the queues refuse further pushes;
// (4) Close waits for them and for the resolved-ts pumps. It is idempotent
// and bounded in time whatever the transport does, since sends never block.
func (svc *Service) Close() error {
	svc.mu.Lock()
	if svc.mu.closed {
		svc.mu.Unlock()
		return nil
	}
	svc.mu.closed = true
	svc.closed.Store(true)
	ds := make([]*dispatcher, 0, svc.mu.dispatchers.Len())
	for d := range svc.mu.dispatchers.All() {
		ds = append(ds, d)
	}
	targets := make([]*target, 0, len(svc.mu.targets))
	for _, t := range svc.mu.targets {
		targets = append(targets, t)
	}
	svc.mu.Unlock()

	var errs []error
	for _, d := range ds {
		if err := svc.unregisterOnClose(d); err != nil {
			errs = append(errs, err)
		}
	}
	svc.knobs.reach(pointCloseUnregistered, nil, nil)
	if svc.schemaCancel != nil {
		svc.schemaCancel()
	}
	close(svc.closing)
	for _, q := range svc.prepQueues {
		q.close()
	}
	svc.wg.Wait()
	svc.stopping.Wait() // pumps of targets whose last dispatcher was removed
	for _, t := range targets {
		t.stop()
	}
	for _, d := range ds {
		svc.retire(d.session.Load())
	}
	svc.metrics.unregister(svc.opts.Registerer)
	return errors.Join(errs...)
}

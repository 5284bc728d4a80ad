package eventstore

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/latency"
	"github.com/cdcflow/eventservice/internal/slots"
	"github.com/cdcflow/eventservice/pkg/common"
)

// markerFile marks a directory as holding a store, so Open may wipe it.
const markerFile = "CDCFLOW_EVENTSTORE"

// pebble's L0 is compacted at storeL0CompactionFiles files and stops
// writes at storeL0StopWritesFiles; Lbase holds storeLBaseBytes.
const (
	storeL0CompactionFiles = 8
	storeL0StopWritesFiles = 32
	storeLBaseBytes        = 256 << 20
	// storeBlockBytes is the tables' block size (pebble's default is 4
	// KiB): pebble writes a table a block per write(2).
	storeBlockBytes = 32 << 10
)

// Store is the pebble-backed event store. See the package documentation for
// its invariants.
//
// Lock order: Store.mu, then subscription.mu. subscriber.mu (held across a
// notifier callback) is never held while taking either.
type Store struct {
	opts    Options
	log     *zap.Logger
	db      *pebble.DB
	cache   *pebble.Cache
	metrics *metrics

	queues []chan writeEvent
	// advanceRoom bounds the PushResolved advances queued per worker and
	// not yet published, as the queue bounds pushes (advance.go).
	advanceRoom []advanceRoom
	// advanceBufs pools the chunks of PushResolved calls (*advanceBuf).
	advanceBufs sync.Pool
	closing     chan struct{} // closed when Close starts
	wg          sync.WaitGroup

	// openIters counts iterators not yet closed (checked by Close).
	openIters atomic.Int64
	// batchSeq numbers the write workers' batches (a subscription's
	// wbBatch names the batch it describes).
	batchSeq atomic.Uint64
	// fresh accounts the subscriptions' fresh rows (fresh.go).
	fresh freshBudget

	// notifyLatency records the real time of the notifier callbacks timed
	// (one in notifySampleEvery of each dispatcher).
	notifyLatency latency.Histogram

	// maint schedules GC and idle expiry (see maintenance.go).
	maint maintenance
	// throttle holds back notifications within NotifyInterval.
	throttle notifyThrottle

	// knobs are the store's test hooks, nil in production.
	knobs testingKnobs

	mu struct {
		sync.RWMutex
		started   bool
		closed    bool
		nextSubID uint64
		// dispatchers maps IDs to subscribers through slots, so that its
		// map holds no pointers for a GC cycle to visit in hash order
		// (slots.Index).
		dispatchers slots.Index[common.DispatcherID, *subscriber]
		// subs holds every live subscription in its slot; subsBySpan the
		// slot of each span's newest, the older ones chained from it
		// through nextSameSpan (a span has more than one when a dispatcher
		// started below what the older one still holds, while the older
		// one keeps its own dispatchers or waits out IdleTTL), so
		// findSharableLocked tries the newest first. No slice per span, and
		// no key stored twice: the map's buckets hold slots, and a probe
		// asks the slot's subscription for its span (slots.Map).
		subsBySpan slots.Map[spanKey]
		subs       slots.Table[*subscription]
		// nsubs counts the live subscriptions, all of which subs holds and
		// subsBySpan chains: no index of them by ID, whose insert a
		// registration would pay.
		nsubs int
		// subscribing marks the spans a registration is subscribing at the
		// upstream (outside the lock); the channel, made by the first
		// registration that waits for it (nil until then), closes when it
		// is done.
		subscribing map[spanKey]chan struct{}
	}
}

// testingKnobs are the points where tests observe the store's goroutines.
// They are set by tests only, before Start (or before the call they watch),
// and are nil in production; each is one nil check on its path.
type testingKnobs struct {
	// published runs on the write worker after each resolved-ts advance
	// was committed and published (notified, or held back by
	// NotifyInterval).
	published func(resolved common.Ts)
	// accounted runs on the write worker once a batch's notifications
	// were added to the notifications counter, with how many (after
	// their callbacks returned, which is why a test that reads the
	// counter waits for it).
	accounted func(notified int)
	// throttleArmed runs when the throttle's flusher armed its timer for
	// wait.
	throttleArmed func(wait time.Duration)
	// stopWaits runs when an unregistration finds its dispatcher's
	// callback in flight and is about to wait for it.
	stopWaits func()
	// subscribeWaits runs when a registration found its span being
	// subscribed by another and is about to wait for it.
	subscribeWaits func()
	// advanceWaits runs when a PushResolved found no room for its advances
	// and is about to wait for it.
	advanceWaits func()
}

// Open creates a store. It starts no goroutine: call Start.
func Open(opts Options) (*Store, error) {
	opts = opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	s := &Store{opts: opts, log: opts.Logger.Named("eventstore"), closing: make(chan struct{})}
	s.throttle.doorbell = make(chan struct{}, 1)
	s.fresh.limit = opts.FreshBytes
	s.metrics = newMetrics(&s.fresh)
	s.mu.dispatchers.Reserve(opts.ExpectedDispatchers)
	s.mu.subsBySpan.Reserve(opts.ExpectedDispatchers)
	s.mu.subs.Reserve(opts.ExpectedDispatchers)
	s.mu.subscribing = make(map[spanKey]chan struct{})
	s.queues = make([]chan writeEvent, opts.WriteWorkers)
	s.advanceRoom = make([]advanceRoom, opts.WriteWorkers)
	for i := range s.queues {
		s.queues[i] = make(chan writeEvent, opts.WriteQueueSize)
		s.advanceRoom[i].init(opts.WriteQueueSize)
	}

	// The store's own reference to its block cache, released at Close: a
	// shared cache stays its owner's (Options.Cache), who holds another.
	cache := opts.Cache
	if cache == nil {
		cache = pebble.NewCache(opts.CacheBytes)
	} else {
		cache.Ref()
	}
	popts := &pebble.Options{
		Cache:        cache,
		MemTableSize: opts.MemTableBytes,
		// The store is a cache of the upstream (wiped at Open), so the WAL
		// buys nothing: losing the memtable on a crash loses nothing the
		// upstream cannot replay.
		DisableWAL: true,
		Logger:     pebbleLogger{s.log.Named("pebble").Sugar()},
		// A row is written once, read by its dispatchers' scans and then
		// deleted by GC: compacting it is mostly rewriting what will soon
		// be dropped. So L0 takes more files before a compaction, and
		// Lbase more bytes, than pebble's defaults (4 files, 64 MiB), and
		// a GC'd range still in L0 is dropped, not rewritten, when L0 is
		// compacted.
		L0CompactionThreshold: storeL0CompactionFiles,
		L0StopWritesThreshold: storeL0StopWritesFiles,
		LBaseMaxBytes:         storeLBaseBytes,
	}
	// Blocks are not compressed: they live seconds to minutes, and
	// compressing them at flush and compaction and decompressing them at
	// every scan is CPU taken from the cores the whole pipeline shares
	// (the remote 400k rows/s run: docs/design/eventstore.md).
	for i := range popts.Levels {
		popts.Levels[i].Compression = func() *sstable.CompressionProfile { return sstable.NoCompression }
		popts.Levels[i].BlockSize = storeBlockBytes
	}
	dir := opts.Dir
	if dir == "" {
		popts.FS = vfs.NewMem()
	} else {
		if err := resetDir(dir); err != nil {
			cache.Unref()
			return nil, err
		}
		dir = filepath.Join(dir, "pebble")
	}
	db, err := pebble.Open(dir, popts)
	if err != nil {
		cache.Unref()
		return nil, fmt.Errorf("eventstore: open pebble: %w", err)
	}
	s.db, s.cache = db, cache
	if err := s.metrics.register(opts.Registerer); err != nil {
		_ = db.Close()
		cache.Unref()
		return nil, fmt.Errorf("eventstore: register metrics: %w", err)
	}
	return s, nil
}

// resetDir prepares dir for a fresh store: created if missing, wiped if it
// holds a previous store, refused if it holds anything else.
func resetDir(dir string) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return fmt.Errorf("%w: Dir %q: %v", ErrInvalidOptions, dir, err)
	case len(entries) > 0:
		if _, err := os.Stat(filepath.Join(dir, markerFile)); err != nil {
			return fmt.Errorf("%w: Dir %q is not empty and holds no event store; refusing to wipe it", ErrInvalidOptions, dir)
		}
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("eventstore: reset %q: %w", dir, err)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("eventstore: create %q: %w", dir, err)
	}
	return os.WriteFile(filepath.Join(dir, markerFile), []byte("cdcflow event store: wiped at every open\n"), 0o644)
}

// Start starts the write workers and the maintenance loop. It returns
// ErrClosed after Close and is a no-op when already started.
func (s *Store) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return ErrClosed
	}
	if s.mu.started {
		return nil
	}
	s.mu.started = true
	for i := range s.queues {
		s.wg.Go(func() { s.runWriter(i) })
	}
	s.wg.Go(s.runMaintenance)
	if s.opts.NotifyInterval > 0 {
		s.wg.Go(s.runThrottle)
	}
	return nil
}

func (s *Store) isClosing() bool {
	select {
	case <-s.closing:
		return true
	default:
		return false
	}
}

// DispatcherState is a snapshot of one dispatcher's view of the store.
type DispatcherState struct {
	SubscriptionID uint64
	StartTs        common.Ts
	Checkpoint     common.Ts
	ResolvedTs     common.Ts // the subscription's committed resolved-ts
	MaxCommitTs    common.Ts
}

// Dispatcher returns a snapshot of dispatcher id's state.
func (s *Store) Dispatcher(id common.DispatcherID) (DispatcherState, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	sb, err := s.subscriberLocked(id)
	if err != nil {
		return DispatcherState{}, err
	}
	sub := sb.sub
	sub.mu.Lock()
	defer sub.mu.Unlock()
	return DispatcherState{SubscriptionID: sub.id, StartTs: sb.startTs, Checkpoint: sb.checkpoint,
		ResolvedTs: sub.mu.resolved, MaxCommitTs: sub.mu.maxCommit}, nil
}

// Flush writes pebble's memtables out as sstables and waits. Operators
// use it before a backup of a disk store; benchmarks use it so that two
// scans compared with each other read the same on-disk layout.
func (s *Store) Flush() error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.mu.closed {
		return ErrClosed
	}
	return s.db.Flush()
}

// Stats is a snapshot of the store's counters.
type Stats struct {
	Subscriptions int
	Dispatchers   int
	// NotifyCount counts notifier callbacks. NotifyMax, NotifyP50 and
	// NotifyP99 describe the real time spent inside the ones timed: one in
	// 8 of each dispatcher, its first included.
	NotifyCount          uint64
	NotifyP50, NotifyP99 time.Duration
	NotifyMax            time.Duration
}

// Stats returns a snapshot of the store's counters.
func (s *Store) Stats() Stats {
	s.mu.RLock()
	st := Stats{Subscriptions: s.mu.nsubs, Dispatchers: s.mu.dispatchers.Len()}
	s.mu.RUnlock()
	var m dto.Metric
	if s.metrics.notifications.Write(&m) == nil {
		st.NotifyCount = uint64(m.GetCounter().GetValue())
	}
	st.NotifyP50 = s.notifyLatency.Quantile(0.5)
	st.NotifyP99 = s.notifyLatency.Quantile(0.99)
	st.NotifyMax = s.notifyLatency.Max()
	return st
}

// Close stops the store: Push and registration fail with ErrClosed, every
// dispatcher's notifications stop (waiting for a callback in flight), every
// upstream subscription is ended, the write workers and the maintenance loop
// exit (queued writes are dropped: the store is a cache), then pebble is
// closed.
// Close is idempotent; calls after it return ErrClosed. Iterators must be
// closed first; Close reports leaked ones.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return nil
	}
	s.mu.closed = true
	close(s.closing)
	subs := make([]*subscription, 0, s.mu.nsubs)
	for sub := range s.mu.subs.All() {
		subs = append(subs, sub)
	}
	subscribers := make([]*subscriber, 0, s.mu.dispatchers.Len())
	for sb := range s.mu.dispatchers.All() {
		subscribers = append(subscribers, sb)
	}
	s.mu.Unlock()

	// 1. Stop notifications (waiting for a callback in flight): none runs
	// once Close returns.
	for _, sb := range subscribers {
		sb.stop(s.knobs.stopWaits)
	}
	// 2. End the upstream feeds; pushes already blocked return ErrClosed.
	for _, sub := range subs {
		sub.upstream.Close()
	}
	// 3. Wait for the write workers and the maintenance loop.
	s.wg.Wait()
	s.metrics.unregister(s.opts.Registerer)
	// 4. Close pebble last.
	var errs []error
	if leaked := s.openIters.Load(); leaked > 0 {
		errs = append(errs, fmt.Errorf("eventstore: %d iterators still open at Close", leaked))
	} else if err := s.db.Close(); err != nil {
		errs = append(errs, fmt.Errorf("eventstore: close pebble: %w", err))
	}
	s.cache.Unref()
	return errors.Join(errs...)
}

func cloneKey(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}

func joinErr(a, b error) error {
	if a == nil {
		return b
	}
	return errors.Join(a, b)
}

// pebbleLogger routes pebble's logs to zap.
type pebbleLogger struct{ l *zap.SugaredLogger }

func (p pebbleLogger) Infof(format string, args ...any)  { p.l.Debugf(format, args...) }
func (p pebbleLogger) Errorf(format string, args ...any) { p.l.Errorf(format, args...) }
func (p pebbleLogger) Fatalf(format string, args ...any) { p.l.Fatalf(format, args...) }

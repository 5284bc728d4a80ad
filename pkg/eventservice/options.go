package eventservice

import (
	"math/rand/v2"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/optcheck"
	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

// EventStore is what the service needs of the event store
// (*eventstore.Store implements it).
type EventStore interface {
	RegisterDispatcher(id common.DispatcherID, span common.Span, startTs common.Ts, notifier eventstore.Notifier) error
	UnregisterDispatcher(id common.DispatcherID) error
	UpdateCheckpoint(id common.DispatcherID, ts common.Ts) error
	NewIterator(id common.DispatcherID, r eventstore.ScanRange) (eventstore.RowIterator, error)
}

// handleStore is an EventStore that hands out a handle per registration,
// with the registration, for checkpoint updates without a lookup by ID
// (eventstore.Store does); the service uses it when its store is one,
// UpdateCheckpoint otherwise.
type handleStore interface {
	RegisterDispatcherHandle(id common.DispatcherID, span common.Span, startTs common.Ts, notifier eventstore.Notifier) (eventstore.Handle, error)
}

// Options configures a Service. Zero fields take the documented defaults;
// New validates and reports every bad field at once.
type Options struct {
	// Store is the event store. Required.
	Store EventStore
	// Schema is the schema store. Required.
	Schema schemastore.Store
	// Transport carries messages to collectors. Required.
	Transport messaging.Transport

	// PrepareWorkers is the number of preparation workers, each with its
	// own queue; dispatchers are hashed to one. Default 2: preparation is
	// cheap (a few atomic loads and at most one non-blocking send), so a
	// worker per core is enough.
	PrepareWorkers int
	// ScanWorkers is the number of scan workers. Default 2 (one per core;
	// scans are CPU-bound on an in-memory store).
	ScanWorkers int
	// ScanQueueSize bounds the scan channel between preparation and scan
	// workers. Default 4*ScanWorkers: enough to keep scan workers busy,
	// small enough that work waits in the coalescing preparation queues,
	// where it is bounded by the number of dispatchers, rather than here.
	ScanQueueSize int
	// ScanLimitBytes and ScanLimitRows cap one scan task; a scan stops at
	// the first transaction boundary past either. Defaults 1 MiB and 8192
	// rows: large enough to amortise a pebble seek (~µs) over many rows,
	// small enough that one hot dispatcher cannot monopolise a scan worker
	// for more than a few milliseconds.
	ScanLimitBytes int
	ScanLimitRows  int
	// LargeTxnSplitBytes: a transaction larger than this may be split at a
	// row once the task limit is reached, with an exact row cursor.
	// Default 4 MiB; it must be at least ScanLimitBytes and at most 1 GiB.
	LargeTxnSplitBytes int
	// BatchRows is the number of rows after which a DMLBatch message is
	// closed at the next transaction boundary. Default 256.
	BatchRows int
	// MaxMessagesPerTask caps the messages one scan task sends in one
	// transport call. Default 256; it must be well below the target's
	// inbound capacity or the send could never be accepted.
	MaxMessagesPerTask int
	// BackoffBase and BackoffMax bound a dispatcher's exponential back-off
	// after its target refused or failed a send, and after a failed store
	// re-registration. Defaults 10ms and 1s. Each delay is shortened by up
	// to 20% at random, so that dispatchers refused together do not retry
	// together.
	BackoffBase, BackoffMax time.Duration
	// Rand returns a number in [0,1) for that jitter: a delay d becomes
	// d*(1-0.2*u). The service's workers call it concurrently, so it must
	// be safe for concurrent use; inject one returning 0 for exact delays.
	// A target's resolved-ts set draws its jitter from it too. Default
	// math/rand/v2.Float64.
	Rand func() float64
	// SignalInterval: a dispatcher whose collector has not acknowledged
	// (by heartbeat) the progress published this long ago gets it re-sent
	// as a keepalive resolved-ts. A dropped last message leaves no later
	// message to reveal the seq gap; the keepalive is that later message.
	// Default 1s (TiCDC re-sends every 2s; heartbeats come every 200ms).
	SignalInterval time.Duration
	// ResolvedBatch is the number of resolved-ts advances the target's pump
	// delivers per round. They travel as messaging.ResolvedBatch messages
	// of at most messaging.MaxResolvedBatchEntries entries, one transport
	// call each. Default 512 (one message a round). A message the target
	// reports as too large is split.
	ResolvedBatch int
	// MaxTargets bounds the targets (collectors) the service serves at
	// once; a Register that would add one more is refused with
	// messaging.ErrLimitExceeded. Each target costs a pump goroutine, a
	// resolved-ts set and its metric series, and target names come from
	// other processes, so no peer may grow them without limit. Default
	// 1024.
	MaxTargets int
	// MaxDispatchersPerTarget bounds one target's registered dispatchers,
	// MaxDispatchers all of them (messaging.ErrLimitExceeded beyond
	// either), and MaxSpanKeyBytes the bytes of their spans' keys, which
	// a peer chooses (up to common.MaxSpanKeyBytes each): a dispatcher
	// costs about 1 KiB plus its keys, so the service's memory for
	// dispatchers stays below MaxDispatchers KiB plus MaxSpanKeyBytes
	// (4 GiB + 256 MiB at the defaults) whatever its peers register.
	// Defaults 1<<21, 1<<22 and 256 MiB.
	MaxDispatchersPerTarget int
	MaxDispatchers          int
	MaxSpanKeyBytes         int64
	// ExpectedDispatchers is a size hint: the service's index of
	// dispatchers (by ID and by slot) is allocated at New for this many,
	// so that registering them does not rehash it as it grows. It is not
	// a limit, and at most MaxDispatchers and MaxExpectedDispatchers.
	// Default 0: the index starts
	// small and grows. Each expected dispatcher costs about 30 bytes at
	// New, used or not.
	ExpectedDispatchers int
	// Logger receives the service's logs. Default zap.NewNop().
	Logger *zap.Logger
	// Registerer receives the service's metrics. Default nil: none.
	Registerer prometheus.Registerer
	// Clock drives back-off timers. Default the real clock.
	Clock clock.Clock
}

// Defaults.
const (
	DefaultPrepareWorkers                = 2
	DefaultScanWorkers                   = 2
	DefaultScanLimitBytes                = 1 << 20
	DefaultScanLimitRows                 = 8192
	DefaultLargeTxnSplitBytes            = 4 << 20
	DefaultBatchRows                     = 256
	DefaultMaxMessagesPerTask            = 256
	DefaultBackoffBase                   = 10 * time.Millisecond
	DefaultBackoffMax                    = time.Second
	DefaultResolvedBatch                 = 512
	DefaultSignalInterval                = time.Second
	DefaultMaxTargets                    = 1024
	DefaultMaxDispatchersPerTarget       = 1 << 21
	DefaultMaxDispatchers                = 1 << 22
	DefaultMaxSpanKeyBytes         int64 = 256 << 20
	// MaxExpectedDispatchers bounds the ExpectedDispatchers hint (the
	// memory it takes at New).
	MaxExpectedDispatchers = 1 << 24
)

// EnsureDefaults fills zero fields with their defaults.
func (o Options) EnsureDefaults() Options {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.PrepareWorkers, DefaultPrepareWorkers)
	def(&o.ScanWorkers, DefaultScanWorkers)
	def(&o.ScanQueueSize, 4*o.ScanWorkers)
	def(&o.ScanLimitBytes, DefaultScanLimitBytes)
	def(&o.ScanLimitRows, DefaultScanLimitRows)
	def(&o.LargeTxnSplitBytes, max(DefaultLargeTxnSplitBytes, o.ScanLimitBytes))
	def(&o.BatchRows, DefaultBatchRows)
	def(&o.MaxMessagesPerTask, DefaultMaxMessagesPerTask)
	def(&o.ResolvedBatch, DefaultResolvedBatch)
	def(&o.MaxTargets, DefaultMaxTargets)
	def(&o.MaxDispatchersPerTarget, DefaultMaxDispatchersPerTarget)
	def(&o.MaxDispatchers, DefaultMaxDispatchers)
	if o.MaxSpanKeyBytes == 0 {
		o.MaxSpanKeyBytes = DefaultMaxSpanKeyBytes
	}
	if o.BackoffBase == 0 {
		o.BackoffBase = DefaultBackoffBase
	}
	if o.BackoffMax == 0 {
		o.BackoffMax = DefaultBackoffMax
	}
	if o.SignalInterval == 0 {
		o.SignalInterval = DefaultSignalInterval
	}
	if o.Rand == nil {
		o.Rand = rand.Float64
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	o.Clock = clock.OrReal(o.Clock)
	return o
}

// Validate reports every invalid field. It expects defaults filled in.
func (o Options) Validate() error {
	p := optcheck.New(ErrInvalidOptions)
	p.Required("Store", o.Store)
	p.Required("Schema", o.Schema)
	p.Required("Transport", o.Transport)
	p.NotTypedNil("Clock", o.Clock)
	p.NotTypedNil("Registerer", o.Registerer)
	p.Required("Rand", o.Rand)
	p.IntRange("PrepareWorkers", o.PrepareWorkers, 1, 1024)
	p.IntRange("ScanWorkers", o.ScanWorkers, 1, 1024)
	p.IntRange("ScanQueueSize", o.ScanQueueSize, 1, 1<<20)
	p.IntRange("ScanLimitBytes", o.ScanLimitBytes, 1, 1<<30)
	p.IntRange("ScanLimitRows", o.ScanLimitRows, 1, 1<<24)
	p.IntRange("BatchRows", o.BatchRows, 1, 1<<20)
	p.IntRange("MaxMessagesPerTask", o.MaxMessagesPerTask, 4, 1<<20) // room for a batch, a DDL and a resolved-ts
	p.IntRange("ResolvedBatch", o.ResolvedBatch, 1, 1<<20)
	p.IntRange("MaxTargets", o.MaxTargets, 1, 1<<20)
	p.IntRange("MaxDispatchersPerTarget", o.MaxDispatchersPerTarget, 1, 1<<30)
	p.IntRange("MaxDispatchers", o.MaxDispatchers, 1, 1<<30)
	p.IntRange("ExpectedDispatchers", o.ExpectedDispatchers, 0, min(o.MaxDispatchers, MaxExpectedDispatchers))
	p.Require(o.MaxSpanKeyBytes > 0, "MaxSpanKeyBytes %d must be positive", o.MaxSpanKeyBytes)
	p.Require(o.LargeTxnSplitBytes >= o.ScanLimitBytes, "LargeTxnSplitBytes %d below ScanLimitBytes %d", o.LargeTxnSplitBytes, o.ScanLimitBytes)
	// Above this a large transaction would be read into memory whole.
	p.IntRange("LargeTxnSplitBytes", o.LargeTxnSplitBytes, 1, 1<<30)
	p.Require(o.BackoffBase > 0 && o.BackoffMax >= o.BackoffBase, "BackoffBase %v / BackoffMax %v: need 0 < base <= max", o.BackoffBase, o.BackoffMax)
	p.Require(o.SignalInterval > 0, "SignalInterval %v must be positive", o.SignalInterval)
	return p.Err()
}

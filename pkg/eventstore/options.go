package eventstore

import (
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/optcheck"
	"github.com/cdcflow/eventservice/pkg/clock"
)

// Options configures a Store. The zero value of every field means "use the
// default" documented on the field; Open fills defaults, then validates and
// reports every bad field at once.
type Options struct {
	// Dir is the directory of the on-disk store. Empty (the default) keeps
	// pebble entirely in memory, the embedded default for tests and demos.
	// The store is a cache of the upstream, as in TiCDC: a directory that
	// holds a previous store is wiped at Open. A non-empty directory that
	// does not hold a previous store is refused, so a typo cannot delete
	// someone's data.
	Dir string
	// Upstream is the source of truth the store subscribes spans at.
	// Required.
	Upstream Upstream
	// WriteWorkers is the number of goroutines committing pebble batches;
	// subscriptions are hashed to one of them. Default 2 (one per core of
	// the reference machine; each worker does its own encoding and commit).
	WriteWorkers int
	// WriteQueueSize bounds the batches queued per write worker; Push blocks
	// (back-pressure on the upstream) when it is full. Default 1024.
	WriteQueueSize int
	// MaxBatchRows caps the rows committed in one pebble batch; a worker
	// groups queued pushes up to this many rows. Default 4096.
	MaxBatchRows int
	// MaxBatchBytes caps the same in bytes of keys and values (Row.Size):
	// a worker stops grouping once a batch holds this many, so wide rows
	// (a TOASTed value) do not make a pebble batch of MaxBatchRows of them
	// (4096 rows of 64 kB: 256 MiB, held twice while it is encoded). A
	// single push beyond it is still one batch. Default 4 MiB, half of the
	// default memtable, below pebble's large-batch threshold.
	MaxBatchBytes int
	// IdleTTL is how long a subscription without dispatchers is kept (and
	// fed) before it is ended at the upstream and its data deleted, so a
	// quick remove/re-add does not refetch. Default 1s.
	IdleTTL time.Duration
	// MaintenanceInterval is the period of the loop that runs GC and expires
	// idle subscriptions. Default 100ms.
	MaintenanceInterval time.Duration
	// GCMinSpan: a pending GC range is deleted once the physical time it
	// covers reaches this span, so that tiny ranges do not become a storm of
	// range tombstones. Default 5s.
	GCMinSpan time.Duration
	// GCMaxDelay: a pending GC range is deleted after waiting this long even
	// if it is smaller than GCMinSpan. Default 30s.
	GCMaxDelay time.Duration
	// NotifyInterval is the minimum interval between two resolved-ts
	// notifications of one subscription's dispatchers: an advance within
	// it is held back and the latest one is notified when it is up (never
	// lost). Real upstreams advance resolved-ts on such a cadence (TiCDC's
	// event store subscribes with AdvanceIntervalInMs). Default 0: every
	// advance is notified at once.
	NotifyInterval time.Duration
	// GCInterval: the deletions due are written together, in one pebble
	// batch, at most once per GCInterval. Pebble re-fragments a memtable's
	// range tombstones once per batch that adds some, and every new
	// iterator reads them, so few large batches are cheap where a
	// tombstone per subscription written on its own taxes every scan.
	// Default 1s; a value at or below MaintenanceInterval runs a round at
	// every maintenance tick.
	GCInterval time.Duration
	// CacheBytes is pebble's block cache size. Default 64 MiB, or the
	// size of Cache when that is set (another size is refused).
	CacheBytes int64
	// Cache, if set, is the block cache the store uses in place of one of
	// its own: one cache shared by the stores of a process (pebble.NewCache)
	// bounds their blocks together, and each store's memtables reserve
	// their size in it (pebble's memory accounting), so that what they all
	// hold stays near the cache's size rather than a cache per store. The
	// store takes a reference at Open (Ref) and releases it at Close, so
	// the caller keeps its own and releases it (Unref) once it opens no
	// more stores with it; the cache's memory is freed with the last
	// reference. Default nil: a cache of CacheBytes of the store's own.
	Cache *pebble.Cache
	// MemTableBytes is pebble's memtable size. Up to about three of them
	// are in memory at once (the one written, one being flushed, one kept
	// for reuse); a store that keeps up writes few rows to them (fresh
	// rows, below). Default 64 MiB.
	MemTableBytes uint64
	// FreshBytes bounds the memory of all subscriptions' fresh rows: the
	// newest committed rows, kept beside pebble so that a dispatcher that
	// keeps up is scanned without a pebble iterator, and a subscription
	// every scan of which reads them holds its rows in memory only until
	// they must leave it (write-behind, see fresh.go). Default 64 MiB;
	// negative: none kept, every row is written and every scan reads pebble.
	FreshBytes int64
	// FreshSubscriptionBytes bounds one subscription's fresh rows; its
	// oldest transactions are dropped beyond it (they stay in pebble, or
	// are written there first if they were held only in memory).
	// Default 256 KiB.
	FreshSubscriptionBytes int64
	// ExpectedDispatchers is a size hint: the store's indexes by dispatcher
	// and by span are allocated at Open for this many, so that registering
	// them does not rehash the indexes as they grow. It is not a limit.
	// Default 0: the indexes start small and grow. Each expected dispatcher
	// costs about 50 bytes at Open, used or not.
	ExpectedDispatchers int
	// Logger receives the store's logs. Default zap.NewNop().
	Logger *zap.Logger
	// Registerer receives the store's metrics. Default nil: no metrics are
	// registered (they are still counted, for Stats).
	Registerer prometheus.Registerer
	// Clock is the time source for lag metrics, TTLs and GC delays. Default
	// the real clock.
	Clock clock.Clock
}

// Defaults.
const (
	DefaultWriteWorkers           = 2
	DefaultWriteQueueSize         = 1024
	DefaultMaxBatchRows           = 4096
	DefaultMaxBatchBytes          = 4 << 20
	DefaultIdleTTL                = time.Second
	DefaultMaintenanceInterval    = 100 * time.Millisecond
	DefaultGCMinSpan              = 5 * time.Second
	DefaultGCMaxDelay             = 30 * time.Second
	DefaultGCInterval             = time.Second
	DefaultCacheBytes             = 64 << 20
	DefaultMemTableBytes          = 64 << 20
	DefaultFreshBytes             = 64 << 20
	DefaultFreshSubscriptionBytes = 256 << 10
	// MaxExpectedDispatchers bounds the ExpectedDispatchers hint (the
	// memory it takes at Open).
	MaxExpectedDispatchers = 1 << 24
)

// EnsureDefaults fills every zero field with its default and returns o.
func (o Options) EnsureDefaults() Options {
	if o.WriteWorkers == 0 {
		o.WriteWorkers = DefaultWriteWorkers
	}
	if o.WriteQueueSize == 0 {
		o.WriteQueueSize = DefaultWriteQueueSize
	}
	if o.MaxBatchRows == 0 {
		o.MaxBatchRows = DefaultMaxBatchRows
	}
	if o.MaxBatchBytes == 0 {
		o.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if o.IdleTTL == 0 {
		o.IdleTTL = DefaultIdleTTL
	}
	if o.MaintenanceInterval == 0 {
		o.MaintenanceInterval = DefaultMaintenanceInterval
	}
	if o.GCMinSpan == 0 {
		o.GCMinSpan = DefaultGCMinSpan
	}
	if o.GCInterval == 0 {
		o.GCInterval = DefaultGCInterval
	}
	if o.GCMaxDelay == 0 {
		o.GCMaxDelay = DefaultGCMaxDelay
	}
	if o.CacheBytes == 0 {
		o.CacheBytes = DefaultCacheBytes
		if o.Cache != nil {
			o.CacheBytes = o.Cache.MaxSize()
		}
	}
	if o.MemTableBytes == 0 {
		o.MemTableBytes = DefaultMemTableBytes
	}
	if o.FreshBytes == 0 {
		o.FreshBytes = DefaultFreshBytes
	}
	if o.FreshSubscriptionBytes == 0 {
		o.FreshSubscriptionBytes = DefaultFreshSubscriptionBytes
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	o.Clock = clock.OrReal(o.Clock)
	return o
}

// Validate reports every invalid field, each wrapped in ErrInvalidOptions.
// It expects defaults to be filled in.
func (o Options) Validate() error {
	p := optcheck.New(ErrInvalidOptions)
	p.Required("Upstream", o.Upstream)
	p.NotTypedNil("Clock", o.Clock)
	p.NotTypedNil("Registerer", o.Registerer)
	p.IntRange("WriteWorkers", o.WriteWorkers, 1, 256)
	p.IntRange("WriteQueueSize", o.WriteQueueSize, 1, 1<<24)
	p.IntRange("MaxBatchRows", o.MaxBatchRows, 1, 1<<24)
	p.IntRange("MaxBatchBytes", o.MaxBatchBytes, 1, 1<<30)
	p.IntRange("ExpectedDispatchers", o.ExpectedDispatchers, 0, MaxExpectedDispatchers)
	p.Require(o.IdleTTL >= 0, "IdleTTL %v must not be negative", o.IdleTTL)
	p.Require(o.MaintenanceInterval > 0, "MaintenanceInterval %v must be positive", o.MaintenanceInterval)
	p.Require(o.GCMinSpan >= 0, "GCMinSpan %v must not be negative", o.GCMinSpan)
	p.Require(o.GCMaxDelay >= 0, "GCMaxDelay %v must not be negative", o.GCMaxDelay)
	p.Require(o.GCInterval >= 0, "GCInterval %v must not be negative", o.GCInterval)
	p.Require(o.NotifyInterval >= 0, "NotifyInterval %v must not be negative", o.NotifyInterval)
	p.Require(o.CacheBytes >= 0, "CacheBytes %d must not be negative", o.CacheBytes)
	p.Require(o.Cache == nil || o.CacheBytes == o.Cache.MaxSize(), "CacheBytes %d is not the size of Cache (%d): set one", o.CacheBytes, cacheSize(o.Cache))
	p.Require(o.FreshSubscriptionBytes > 0, "FreshSubscriptionBytes %d must be positive", o.FreshSubscriptionBytes)
	p.Require(o.MemTableBytes >= 1<<20 && o.MemTableBytes <= 4<<30, "MemTableBytes %d not in [1 MiB, 4 GiB]", o.MemTableBytes)
	return p.Err()
}

// cacheSize is c's size (0 for none).
func cacheSize(c *pebble.Cache) int64 {
	if c == nil {
		return 0
	}
	return c.MaxSize()
}

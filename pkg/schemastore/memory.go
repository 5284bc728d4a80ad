package schemastore

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/common"
)

// MemoryOptions configures NewMemory. The zero value is valid.
type MemoryOptions struct {
	// InitialResolvedTs is the frontier the store starts at. Default 0.
	InitialResolvedTs common.Ts
	// InitialDDLs is history loaded before the store is returned, for
	// bootstrapping a table's past. Unlike AddDDL these may lie at or below
	// InitialResolvedTs; each must still be valid and unique per (table,
	// commit-ts), in any order. Default none.
	InitialDDLs []DDL
	// Logger receives debug logs. Default zap.NewNop().
	Logger *zap.Logger
}

// EnsureDefaults returns a copy of o with every zero field set to its
// documented default.
func (o MemoryOptions) EnsureDefaults() MemoryOptions {
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return o
}

// Validate reports every invalid field, each wrapping ErrInvalidOptions. It
// expects defaults filled in (EnsureDefaults).
func (o MemoryOptions) Validate() error {
	var errs []error
	seen := make(map[tableTs]struct{}, len(o.InitialDDLs))
	for i, d := range o.InitialDDLs {
		if err := d.validate(); err != nil {
			errs = append(errs, fmt.Errorf("%w: InitialDDLs[%d]: %w", ErrInvalidOptions, i, err))
			continue
		}
		k := tableTs{d.TableID, d.CommitTs}
		if _, dup := seen[k]; dup {
			errs = append(errs, fmt.Errorf("%w: InitialDDLs[%d]: %w: table %d at %d",
				ErrInvalidOptions, i, ErrDuplicateDDL, d.TableID, uint64(d.CommitTs)))
		}
		seen[k] = struct{}{}
	}
	return errors.Join(errs...)
}

type tableTs struct {
	table int64
	ts    common.Ts
}

// tableHistory is the known DDL history of one table.
//
// INVARIANT: ddls is sorted by CommitTs, strictly ascending (no duplicates).
// INVARIANT: every DDL GC dropped has CommitTs <= lastGCed, and lastGCed is
// below every remaining DDL's CommitTs and at or below the frontier.
type tableHistory struct {
	ddls []DDL
	// lastGCed is the commit-ts of the newest DDL GC dropped, zero if none.
	// TableState falls back to it so that GC never makes a table look as if
	// it had no DDL in a range where it had one.
	lastGCed common.Ts
}

// searchAbove returns the index of the first DDL with CommitTs > ts.
func (t *tableHistory) searchAbove(ts common.Ts) int {
	i, found := slices.BinarySearchFunc(t.ddls, ts, func(d DDL, ts common.Ts) int {
		return cmp.Compare(d.CommitTs, ts)
	})
	if found {
		i++ // CommitTs is unique per table, so the match is the only equal one.
	}
	return i
}

// Memory is an in-memory Store whose history and frontier are driven by the
// caller through AddDDL and AdvanceResolvedTs. It starts no goroutines.
//
// Lock order: subscriber.mu -> Memory.mu. A subscriber's callback runs with
// its own subscriber.mu held and may take Memory.mu (read methods);
// Memory.mu is never held while a callback runs or while a subscriber.mu is
// taken, so the order cannot invert.
type Memory struct {
	logger *zap.Logger

	// knobs are set by tests before any Subscribe; zero in production.
	knobs testingKnobs

	mu struct {
		// RWMutex so that the scheduler's many readers do not block each other.
		sync.RWMutex
		// resolvedTs is the frontier. INVARIANT: never decreases.
		resolvedTs common.Ts
		tables     map[int64]*tableHistory
		// subs is copy-on-write: Subscribe and cancel replace it whole and
		// never mutate it, so an advance can iterate the snapshot it read
		// under the lock after unlocking, without copying.
		subs []*subscriber
	}
}

// testingKnobs are the store's test hooks, all in one place: tests set
// them before any Subscribe; in production they are zero and each costs
// one comparison.
type testingKnobs struct {
	// stopWaits runs when a cancel finds its subscriber's callback in
	// flight and is about to wait for it.
	stopWaits func()
}

var _ Store = (*Memory)(nil)

// NewMemory returns a store at opts.InitialResolvedTs holding
// opts.InitialDDLs. Invalid options return an error wrapping
// ErrInvalidOptions.
func NewMemory(opts MemoryOptions) (*Memory, error) {
	opts = opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	m := &Memory{logger: opts.Logger.Named("schemastore")}
	m.mu.resolvedTs = opts.InitialResolvedTs
	m.mu.tables = make(map[int64]*tableHistory)
	for _, d := range opts.InitialDDLs {
		t := m.tableLocked(d.TableID)
		t.ddls = append(t.ddls, d)
	}
	for _, t := range m.mu.tables {
		slices.SortFunc(t.ddls, func(a, b DDL) int { return cmp.Compare(a.CommitTs, b.CommitTs) })
	}
	return m, nil
}

// tableLocked returns the history of id, creating it if needed.
// REQUIRES: m.mu held for writing.
func (m *Memory) tableLocked(id int64) *tableHistory {
	t := m.mu.tables[id]
	if t == nil {
		t = &tableHistory{}
		m.mu.tables[id] = t
	}
	return t
}

// ResolvedTs implements Store.
func (m *Memory) ResolvedTs() common.Ts {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.mu.resolvedTs
}

// TableState implements Store.
func (m *Memory) TableState(tableID int64) (resolvedTs, lastDDLCommitTs common.Ts) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	resolvedTs = m.mu.resolvedTs
	t := m.mu.tables[tableID]
	if t == nil {
		return resolvedTs, 0
	}
	// DDLs above the frontier were added early; they are not history yet.
	if i := t.searchAbove(resolvedTs); i > 0 {
		return resolvedTs, t.ddls[i-1].CommitTs
	}
	return resolvedTs, t.lastGCed
}

// FetchDDLs implements Store. It fails with ErrRangeTruncated only if GC
// dropped a DDL inside (start, end].
func (m *Memory) FetchDDLs(tableID int64, start, end common.Ts, dst []DDL) ([]DDL, error) {
	if tableID < 0 {
		return dst, fmt.Errorf("%w: negative table id %d", ErrInvalidRange, tableID)
	}
	if start > end {
		return dst, fmt.Errorf("%w: start %d after end %d", ErrInvalidRange, uint64(start), uint64(end))
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	if end > m.mu.resolvedTs {
		return dst, fmt.Errorf("%w: table %d range (%d, %d], resolved-ts %d",
			ErrRangeAboveResolved, tableID, uint64(start), uint64(end), uint64(m.mu.resolvedTs))
	}
	t := m.mu.tables[tableID]
	if t == nil {
		return dst, nil
	}
	if start < t.lastGCed {
		return dst, fmt.Errorf("%w: table %d range (%d, %d], DDLs up to %d were dropped",
			ErrRangeTruncated, tableID, uint64(start), uint64(end), uint64(t.lastGCed))
	}
	return append(dst, t.ddls[t.searchAbove(start):t.searchAbove(end)]...), nil
}

// AddDDL records d. Its commit-ts must be above the frontier (the history at
// and below it is complete by promise); d becomes visible to readers once the
// frontier reaches it. Errors wrap ErrInvalidDDL, ErrDDLBeforeFrontier or
// ErrDuplicateDDL, and leave the store unchanged.
func (m *Memory) AddDDL(d DDL) error {
	if err := d.validate(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if d.CommitTs <= m.mu.resolvedTs {
		return fmt.Errorf("%w: table %d commit-ts %d, resolved-ts %d",
			ErrDDLBeforeFrontier, d.TableID, uint64(d.CommitTs), uint64(m.mu.resolvedTs))
	}
	t := m.tableLocked(d.TableID)
	i, found := slices.BinarySearchFunc(t.ddls, d.CommitTs, func(e DDL, ts common.Ts) int {
		return cmp.Compare(e.CommitTs, ts)
	})
	if found {
		return fmt.Errorf("%w: table %d already has a DDL at %d", ErrDuplicateDDL, d.TableID, uint64(d.CommitTs))
	}
	t.ddls = slices.Insert(t.ddls, i, d)
	return nil
}

// AdvanceResolvedTs moves the frontier to ts and then calls every subscriber
// with it, synchronously, with no store lock held. A ts equal to the current
// frontier is a no-op that notifies nobody; a lower one fails with
// ErrResolvedTsRegressed.
func (m *Memory) AdvanceResolvedTs(ts common.Ts) error {
	m.mu.Lock()
	cur := m.mu.resolvedTs
	if ts < cur {
		m.mu.Unlock()
		return fmt.Errorf("%w: %d is below %d", ErrResolvedTsRegressed, uint64(ts), uint64(cur))
	}
	if ts == cur {
		m.mu.Unlock()
		return nil
	}
	m.mu.resolvedTs = ts
	subs := m.mu.subs
	m.mu.Unlock()

	// Concurrent advances may reach a subscriber out of order; notify drops
	// any value not above the last one delivered, so each subscriber sees a
	// strictly increasing sequence ending with the highest frontier.
	for _, s := range subs {
		s.notify(ts)
	}
	return nil
}

// GC forgets the table's DDLs with commit-ts <= upTo, typically the lowest
// checkpoint of any reader of the table, and returns how many it dropped.
// TableState keeps reporting the newest dropped DDL's commit-ts when nothing
// newer is left, and FetchDDLs refuses (ErrRangeTruncated) ranges that would
// have contained a dropped DDL. upTo must not exceed the frontier
// (ErrRangeAboveResolved); a negative table ID fails with ErrInvalidRange.
func (m *Memory) GC(tableID int64, upTo common.Ts) (int, error) {
	if tableID < 0 {
		return 0, fmt.Errorf("%w: negative table id %d", ErrInvalidRange, tableID)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if upTo > m.mu.resolvedTs {
		return 0, fmt.Errorf("%w: GC of table %d up to %d, resolved-ts %d",
			ErrRangeAboveResolved, tableID, uint64(upTo), uint64(m.mu.resolvedTs))
	}
	t := m.mu.tables[tableID]
	if t == nil {
		return 0, nil
	}
	n := t.searchAbove(upTo)
	if n == 0 {
		return 0, nil
	}
	t.lastGCed = t.ddls[n-1].CommitTs
	// slices.Delete shifts in place and clears the tail, so dropped queries
	// are not kept alive by the backing array.
	t.ddls = slices.Delete(t.ddls, 0, n)
	m.logger.Debug("dropped DDLs", zap.Int64("table", tableID), zap.Int("count", n),
		zap.Uint64("upTo", uint64(upTo)), zap.Int("left", len(t.ddls)))
	return n, nil
}

// Subscribe implements Store.
func (m *Memory) Subscribe(fn func(resolvedTs common.Ts)) (cancel func()) {
	if fn == nil {
		m.logger.Warn("Subscribe called with a nil callback; ignored")
		return func() {}
	}
	s := &subscriber{fn: fn}
	m.mu.Lock()
	// Seeding last with the current frontier, under the same lock an advance
	// takes to publish a new one, means an advance that happened before this
	// Subscribe is not replayed and one that happens after is delivered.
	s.mu.last = m.mu.resolvedTs
	m.mu.subs = append(slices.Clip(m.mu.subs), s)
	m.mu.Unlock()

	var once sync.Once
	return func() {
		once.Do(func() {
			s.stop(m.knobs.stopWaits)
			m.removeSubscriber(s)
		})
	}
}

// removeSubscriber drops s from the copy-on-write list.
func (m *Memory) removeSubscriber(s *subscriber) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if i := slices.Index(m.mu.subs, s); i >= 0 {
		// Build a new slice: advances may still be iterating the old one.
		subs := make([]*subscriber, 0, len(m.mu.subs)-1)
		subs = append(subs, m.mu.subs[:i]...)
		m.mu.subs = append(subs, m.mu.subs[i+1:]...)
	}
}

// subscriber is one registration of Subscribe.
//
// INVARIANT: fn runs only with mu held and only while !mu.stopped, so once
// stop has returned (it takes mu, thus waits for a running fn) fn never runs
// again.
type subscriber struct {
	fn func(common.Ts)
	mu struct {
		sync.Mutex
		stopped bool
		// last is the highest frontier fn was called with, or the frontier
		// when the subscription was made.
		last common.Ts
	}
}

// notify calls fn with ts unless the subscriber stopped or already saw a
// frontier at least as high.
func (s *subscriber) notify(ts common.Ts) {
	s.mu.Lock()
	defer s.mu.Unlock() // deferred so a panicking callback cannot wedge cancel
	if s.mu.stopped || ts <= s.mu.last {
		return
	}
	s.mu.last = ts
	s.fn(ts)
}

// stop prevents further calls; it returns after any running call finished.
// waiting, if not nil, runs when a call is in flight and stop is about to
// wait for it (a test hook: it makes "cancel waits" observable).
func (s *subscriber) stop(waiting func()) {
	if !s.mu.TryLock() {
		if waiting != nil {
			waiting()
		}
		s.mu.Lock()
	}
	s.mu.stopped = true
	s.mu.Unlock()
}

package pendingset

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"go.uber.org/zap"
)

// Result is a deliverer's verdict on one entry of a batch that was
// delivered (Complete with a nil error). The zero value is Delivered.
type Result uint8

const (
	// Delivered: the key's value reached the target. The key leaves the set,
	// unless a newer value was added meanwhile; then it is queued once more.
	Delivered Result = iota
	// FailedKey: the target rejected this key. One attempt of the key's
	// budget is spent and the key backs off (BackoffBase*2^(attempts-1));
	// after MaxAttempts it is quarantined.
	FailedKey
	// RetryKey: this key could not be handled now, through no fault of its
	// own (for example the target is busy for it). No budget is spent; the
	// key backs off by its count of consecutive transient retries.
	RetryKey
)

func (r Result) String() string {
	switch r {
	case Delivered:
		return "delivered"
	case FailedKey:
		return "failed-key"
	case RetryKey:
		return "retry-key"
	default:
		return fmt.Sprintf("result(%d)", uint8(r))
	}
}

// Entry is one key of a drained batch. Key, Value and Attempts are for the
// deliverer to read; Result is for it to set. The unexported fields tie the
// entry to the Drain call that produced it.
type Entry[K comparable, V any] struct {
	Key   K
	Value V
	// Attempts is the number of budgeted failures of this key since its
	// last successful delivery.
	Attempts int
	// Result is the per-key verdict; see Complete.
	Result Result

	idx     int32  // the key's node
	token   uint64 // the Drain call that handed it out
	since   int64  // first add of Value, clock ns since Set.base, or noStamp
	drained int64  // when Drain handed it out
}

// latencySampleEvery: one insertion in this many is timestamped for the
// first-add-to-drain histogram. Reading the clock costs as much as the rest
// of Add; sampling (as CockroachDB's rangefeed scheduler does, also every
// 13th) keeps the distribution and drops the cost. Without a Registerer
// nothing is timestamped.
const latencySampleEvery = 13

// noStamp marks a value whose first add was not timestamped.
const noStamp int64 = math.MinInt64

// Set is a coalescing pending set: at most one undelivered value per key,
// delivered in bounded batches in the order keys became pending, and kept
// until the delivery succeeds. It starts no goroutine; a Pump, or a caller
// using Doorbell, Drain and Complete, moves the data.
//
// INVARIANTS (checked by the tests' checkInvariants):
//   - len(mu.index) == len(mu.nodes) <= mu.maxLen, the peak number of keys
//     held at once: idle slots are repurposed before the slice grows.
//   - mu.count[st] is the number of nodes in state st.
//   - the ready FIFO holds exactly the ready nodes; the due heap exactly the
//     backing-off and quarantined ones; in-flight nodes are in neither.
//   - if the FIFO is non-empty, the doorbell holds a token or a consumer has
//     not yet drained since the FIFO last became non-empty.
//
// LOCK ORDER: Set.mu is a leaf, except that Merge, Bypass, Rand and
// Clock.Now are called under it (they must not call back into the Set).
// Metrics are observed and the doorbell is rung after releasing it.
type Set[K comparable, V any] struct {
	opts     Options[K, V] // defaulted and validated; immutable
	hasher   hasher[K]     // the index's hash function (hash.go)
	base     time.Time     // clock reading at New; node times are offsets from it
	log      *zap.Logger
	doorbell chan struct{} // capacity 1: "something may be ready"
	metrics  *metrics[K, V]

	mu struct {
		sync.Mutex
		// index maps keys to node numbers (table.go); used counts its
		// occupied entries. slots and nodes are a key's hot and cold
		// data, indexed by node number.
		index []uint64
		used  int
		slots []slot[K, V]
		nodes []node
		// delivered holds, per node, the value last delivered for its key
		// (Options.Supersedes set only; nil otherwise, so the sets that do
		// not use it pay nothing). Reset when the slot changes keys.
		delivered []lastDelivered[V]
		ready     fifo // node numbers of the ready keys, oldest first
		// idle is the idle queue, oldest first from idle[idleHead]; it
		// also holds stale entries (see idleEntry).
		idle     []idleEntry
		idleHead int
		heap     []int32
		count    [numStates]int
		token    uint64 // last drain token handed out
		stampSeq uint64 // insertions considered for timestamping
		maxLen   int    // high-water mark of keys held (not idle)
		stats    Stats  // counters; gauges are filled in by Stats()
		touched  uint64 // keeps touchAheadLocked's reads
	}
}

// New validates o and returns an empty Set. It starts nothing. If
// o.Registerer is set, the set's metrics are registered there; a name
// collision is returned as the Registerer's error.
func New[K comparable, V any](o Options[K, V]) (*Set[K, V], error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	o = o.EnsureDefaults()
	s := &Set[K, V]{
		opts:     o,
		base:     o.Clock.Now(),
		log:      o.Logger.Named("pendingset"),
		doorbell: make(chan struct{}, 1),
	}
	s.hasher = newHasher[K]()
	s.mu.token = rand.Uint64() >> 1 // random start, far from wrapping to 0
	if o.Registerer != nil {
		m := newMetrics(s)
		if err := o.Registerer.Register(m); err != nil {
			return nil, fmt.Errorf("pendingset: register metrics: %w", err)
		}
		s.metrics = m
	}
	return s, nil
}

// Unregister removes the set's metrics from the Registerer it was built
// with. It reports whether they were registered.
func (s *Set[K, V]) Unregister() bool {
	if s.metrics == nil {
		return false
	}
	return s.opts.Registerer.Unregister(s.metrics)
}

// nowLocked reads the clock as nanoseconds since s.base (monotonic with the
// real clock).
func (s *Set[K, V]) nowLocked() int64 { return int64(s.opts.Clock.Now().Sub(s.base)) }

// stampLocked returns the time to record as a new value's first add: the
// clock for one call in latencySampleEvery when metrics are on, else
// noStamp. REQUIRES: s.mu held.
func (s *Set[K, V]) stampLocked() int64 {
	if s.metrics == nil {
		return noStamp
	}
	s.mu.stampSeq++
	if (s.mu.stampSeq-1)%latencySampleEvery != 0 {
		return noStamp
	}
	return s.nowLocked()
}

// ring puts a token in the doorbell unless one is already there.
func (s *Set[K, V]) ring() {
	select {
	case s.doorbell <- struct{}{}:
	default:
	}
}

// Doorbell returns the capacity-one channel that receives a token when a
// key becomes ready in an empty ready FIFO, or Complete re-queues keys.
// After taking a token a consumer must Drain until Drain returns nothing:
// one token may stand for many keys, including keys added while it drains. Keys that become due
// after a backoff do not ring it; wake at NextDue for those (Pump does).
func (s *Set[K, V]) Doorbell() <-chan struct{} { return s.doorbell }

// Add records v as key k's newest value. It never blocks on a consumer
// (only on the set's short critical section), takes no context (one
// caller's cancellation must not cancel a wakeup others need), never
// fails, and is O(1). When k is already held it allocates nothing: v is
// merged into the held value with Merge.
//
// What happens to k depends on its state: absent -> ready at the tail of
// the FIFO; ready, backing off or quarantined -> merged, position kept;
// in flight -> kept aside as the dirty value and queued once more when the
// delivery completes, however many adds arrive. A backing-off key becomes
// ready at once only if Options.Bypass says so. Add is valid at any time,
// including after a Pump stopped; the key then simply waits in the set.
func (s *Set[K, V]) Add(k K, v V) {
	if s.add(k, v) {
		s.ring()
	}
}

// AddMany is Add of keys[i] with vals[i] for every i, in order, under one
// lock and with at most one doorbell ring: the same outcome as the calls
// one by one, for a producer that has many keys at once (one lock and one
// ring for all of them, not one per key). keys and vals have the same
// length; the set keeps neither slice.
func (s *Set[K, V]) AddMany(keys []K, vals []V) {
	if len(keys) != len(vals) {
		panic("pendingset: AddMany with keys and values of different lengths")
	}
	if s.addMany(keys, vals) {
		s.ring()
	}
}

func (s *Set[K, V]) addMany(keys []K, vals []V) (ring bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range keys {
		if i%touchChunk == 0 {
			s.touchAheadLocked(keys[i:min(i+touchChunk, len(keys))])
		}
		ring = s.addLocked(keys[i], vals[i]) || ring
	}
	return ring
}

// add is Add under the lock, released by defer: Merge, Bypass and the
// clock are the user's code and may panic. It reports whether the doorbell
// must ring.
func (s *Set[K, V]) add(k K, v V) (ring bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addLocked(k, v)
}

// addLocked is one Add. REQUIRES: s.mu held.
func (s *Set[K, V]) addLocked(k K, v V) (ring bool) {
	s.mu.stats.Adds++
	// The doorbell rings only when the ready FIFO goes from empty to
	// non-empty: while it holds keys, either a token is waiting or the
	// consumer has taken one and, by the Doorbell contract, drains until
	// Drain returns nothing, which includes this key. Ringing on every
	// insertion would make each Add wake a consumer parked on the channel
	// (a goroutine hand-off per key when keys are many and the consumer
	// keeps up).
	wasEmpty := s.mu.ready.len == 0
	i, ok := s.findLocked(k)
	if !ok {
		s.insertLocked(k, v, s.stampLocked())
		return wasEmpty
	}
	sl := &s.mu.slots[i]
	if sl.state == stateIdle {
		if s.supersededLocked(i, v) {
			return false
		}
		s.reviveLocked(i, sl, v, s.stampLocked())
		return wasEmpty
	}
	return s.mergeLocked(i, sl, v) && wasEmpty
}

// drain is Drain under the lock (released by defer: the clock is the
// user's code).
func (s *Set[K, V]) drain(limit int, dst []Entry[K, V]) ([]Entry[K, V], int64) {
	start := len(dst)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.nowLocked()
	s.promoteDueLocked(now)
	s.mu.token++
	tok := s.mu.token
	bytes := 0
	for len(dst)-start < limit && s.mu.ready.len > 0 {
		if s.opts.Size != nil {
			sl := s.slotLocked(s.mu.ready.front())
			size := s.opts.Size(sl.key, sl.val)
			if len(dst) > start && bytes+size > s.opts.MaxBatchBytes {
				break // the rest goes in the next batch
			}
			bytes += size
		}
		dst = append(dst, s.popReadyLocked(tok, now))
	}
	s.mu.stats.Drains++
	got := len(dst) - start
	if got == 0 {
		s.mu.stats.EmptyDrains++
	}
	s.mu.stats.Drained += uint64(got)
	return dst, now
}

// mergeLocked merges v into held node i (slot n) and reports whether the
// key became ready (so the doorbell must ring). REQUIRES: s.mu held.
func (s *Set[K, V]) mergeLocked(i int32, n *slot[K, V], v V) (becameReady bool) {
	switch n.state {
	case stateInFlight:
		if !n.dirty {
			// The first add since the drain: a new obligation, not a merge.
			n.val, n.dirty = v, true
			s.setSinceLocked(i, n, s.stampLocked())
			return false
		}
	case stateBackoff:
		bypass := s.opts.Bypass != nil && s.opts.Bypass(n.val, v)
		n.val = s.opts.Merge(n.val, v)
		s.mu.stats.Coalesced++
		if bypass {
			s.mu.stats.Bypasses++
			s.readyLocked(i, n, false)
			return true
		}
		return false
	}
	// ready, quarantined, or in flight and already dirty.
	n.val = s.opts.Merge(n.val, v)
	s.mu.stats.Coalesced++
	return false
}

// Drain moves up to limit ready keys (limit <= 0 means Options.MaxBatch)
// to in flight and appends them to dst, oldest-pending first. Keys whose backoff
// or quarantine has expired are first appended to the ready FIFO. Every
// returned entry must later be passed to Complete; until then its key is
// never handed out again (an Add marks it dirty instead). Drain returns
// fewer than limit entries only when nothing else is ready or the next
// entry would take the batch over Options.MaxBatchBytes. A deliverer
// reads Key, Value and Attempts and sets Result; nothing else.
func (s *Set[K, V]) Drain(limit int, dst []Entry[K, V]) []Entry[K, V] {
	if limit <= 0 {
		limit = s.opts.MaxBatch
	}
	start := len(dst)
	dst, now := s.drain(limit, dst)
	if s.metrics != nil {
		s.metrics.observeDrain(dst[start:], now)
	}
	return dst
}

// lastDelivered is the value last delivered for a node's key.
type lastDelivered[V any] struct {
	v  V
	ok bool
}

// supersededLocked reports, and counts, whether v is not to be delivered
// because the key's last delivered value supersedes it (Options.Supersedes).
// REQUIRES: s.mu held.
func (s *Set[K, V]) supersededLocked(i int32, v V) bool {
	if s.opts.Supersedes == nil || int(i) >= len(s.mu.delivered) {
		return false
	}
	if last := &s.mu.delivered[i]; last.ok && !s.opts.Supersedes(v, last.v) {
		s.mu.stats.Superseded++
		return true
	}
	return false
}

// noteDeliveredLocked records v as node i's last delivered value.
// REQUIRES: s.mu held.
func (s *Set[K, V]) noteDeliveredLocked(i int32, v V) {
	if s.opts.Supersedes == nil {
		return
	}
	for int(i) >= len(s.mu.delivered) {
		s.mu.delivered = append(s.mu.delivered, lastDelivered[V]{})
	}
	s.mu.delivered[i] = lastDelivered[V]{v: v, ok: true}
}

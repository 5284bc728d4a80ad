package eventservice

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// dispatcher is one registration of a dispatcher ID, for its whole life
// (Register to Remove): a later registration of the same ID is another
// dispatcher. Its epochs are sessions; the current one is swapped
// atomically on reset.
//
// The notify path touches only the atomics and the current session's
// scheduling word. Lock order: Service.mu, then dispatcher.mu; sendMu and
// target.deliverMu are taken with neither held (target.deliverMu, then
// Service.mu read, in the pump).
type dispatcher struct {
	// The notify path's fields come first, so that a notification touches
	// one cache line of the dispatcher (and one of its session) when the
	// dispatcher starts on a line. In the 288-byte size class every other
	// dispatcher of a span starts half a line in, and its notify fields
	// span two lines; the notify benchmarks did not move when it left the
	// 320-byte class (docs/benchmarks.md, the steps table).
	svc *Service
	// session is the current epoch.
	session atomic.Pointer[session]
	// received is the largest resolved-ts the store notified; maxCommit its
	// companion hint. Written only by the notifier (maxCommit first), read
	// by owners (received first), so a reader that sees a resolved-ts also
	// sees a max-commit-ts at least as new.
	received  atomic.Uint64
	maxCommit atomic.Uint64
	worker    int
	// first is the first epoch's session, allocated with the dispatcher so
	// that its scheduling word shares the notify path's cache line (a
	// notification then touches one line, not two scattered ones; at a
	// million dispatchers that is the difference). Later epochs are
	// allocated on reset.
	first session

	id     common.DispatcherID
	reg    messaging.RegistrationID
	span   common.PackedSpan
	target *target
	// collectorSlot is the collector's index of the dispatcher
	// (RegisterRequest.Slot), echoed in its resolved-ts; slot is the
	// service's (Service.mu.dispatchers), sent in its handshakes for the
	// collector to echo in heartbeats.
	collectorSlot, slot uint32

	// sendMu is held by an owner (a preparation or scan worker) from its
	// check that its session is not retired through its transport send, so
	// that Remove, which takes it once after retiring the session, returns
	// only when no send of this registration is in progress (the fence).
	// Sends never block, so it is held for one transport call at most.
	sendMu sync.Mutex

	mu struct {
		sync.Mutex
		removed bool
		// needRegister: a reset below the store's checkpoint re-registers
		// the dispatcher in the store from registerTs, and that failed;
		// the registrar retries (attempt counts the tries). The small
		// fields share a word: there is one of these per dispatcher.
		needRegister bool
		attempt      int32
		registerTs   common.Ts
		// checkpoint is the largest heartbeat checkpoint accepted (the
		// store holds it, or an older one with no row between the two:
		// storeNeedsCheckpoint); storeStart the start-ts of the store
		// registration.
		checkpoint common.Ts
		storeStart common.Ts
		// store is the store registration's handle (zero: none, or a
		// store without handles): heartbeats update through it.
		store eventstore.Handle
	}
}

// progress is what a session has delivered. Only the owner (the holder of
// preparing or scanning) reads or writes it.
type progress struct {
	// resolved: every row and DDL at or below it was accepted by the
	// transport (or, for a resolved-only advance, handed to the resolved
	// set, which never drops). Scans start above it.
	resolved common.Ts
	// cursor, when set, is a position above resolved up to which rows were
	// delivered: the next scan resumes strictly after it.
	cursor *eventstore.Cursor
	// seq is the last sequence number used in the epoch; 0 means the
	// handshake was not yet accepted.
	seq uint64
}

// session is one epoch of a dispatcher.
type session struct {
	// sched and the queue state come first: they are what a notification
	// and an enqueue touch.
	sched sched
	// The preparation queue's state, guarded by its mutex: queued, and
	// the generation of the session's entry in the queue's ring.
	qgen   uint32
	queued bool
	// inSet: its progress waits in the target's resolved set (added, not
	// yet delivered). The keepalive loop leaves such a session alone: the
	// set delivers it, and a keepalive would only merge into it. Set before
	// each add, cleared by the pump once it put the session's entry on the
	// wire (which also restarts pubAt: an acknowledgement is due an
	// interval after delivery, not after publication). Beside queued, in
	// what was its padding: eight bytes of every session.
	inSet atomic.Bool
	d     *dispatcher
	epoch uint64

	// own is the owner-only state, which only the core's step changes.
	own owner

	// sent is progress.resolved, published for heartbeats and metrics.
	sent atomic.Uint64
	// pub is the last progress known delivered to the transport or the
	// resolved set, as one consistent (ts, seq) pair, and pubAt when it
	// changed (nanoseconds since Service.clockBase, 0 for never): the keepalive loop re-sends it to a
	// collector that has not acknowledged it (a dropped last message is
	// otherwise undetectable). pubAt is apart, an atomic, so that the loop
	// tells young progress (most of what it examines) without the lock; a
	// read of it torn from the pair only moves a keepalive by one round.
	pub struct {
		sync.Mutex
		ts  common.Ts
		seq uint64
	}
	pubAt atomic.Int64
	// blockedAt is the schema frontier the session waits to see pass.
	blockedAt atomic.Uint64
	// kaGen is the keepalive generation whose list holds the session (see
	// keepaliveSet).
	kaGen atomic.Uint64
}

// publish records delivered progress (ts at seq) and has the keepalive
// loop look at the session an interval later.
func (s *session) publish(ts common.Ts, seq uint64, now time.Time) {
	s.pub.Lock()
	s.pub.ts, s.pub.seq = ts, seq
	s.pub.Unlock()
	s.pubAt.Store(s.d.svc.sinceBase(now))
	s.d.svc.kaSet.note(s)
}

// published returns the last delivered progress and when it changed.
func (s *session) published() (common.Ts, uint64, time.Time) {
	s.pub.Lock()
	ts, seq := s.pub.ts, s.pub.seq
	s.pub.Unlock()
	return ts, seq, s.d.svc.clockBase.Add(time.Duration(s.pubAt.Load()))
}

// touch restarts the keepalive timer of the published progress.
func (s *session) touch(now time.Time) {
	s.pubAt.Store(s.d.svc.sinceBase(now))
	s.d.svc.kaSet.note(s)
}

func newSession(d *dispatcher, epoch uint64, startTs common.Ts) *session {
	s := &session{}
	s.init(d, epoch, startTs)
	return s
}

// init prepares a zero session for epoch of d from startTs.
func (s *session) init(d *dispatcher, epoch uint64, startTs common.Ts) {
	s.d, s.epoch = d, epoch
	s.own.progress.resolved, s.own.startTs = startTs, startTs
	s.own.roomSignal = d.target != nil && d.target.room != nil
	s.sent.Store(uint64(startTs))
}

var (
	_ eventstore.Notifier     = (*dispatcher)(nil)
	_ eventstore.TouchAheader = (*dispatcher)(nil)
)

// Notify is the store's callback (the dispatcher is its own
// eventstore.Notifier: no closure per dispatcher). It is O(1) and
// allocation-free: it advances the frontier and requests preparation; it
// never blocks, whatever the state of the queues, the transport or the
// downstream.
func (d *dispatcher) Notify(resolved, maxCommit common.Ts) {
	svc := d.svc
	if svc.closed.Load() {
		return
	}
	storeMax(&d.maxCommit, uint64(maxCommit)) // before received: see the field comment
	storeMax(&d.received, uint64(resolved))
	if s := d.session.Load(); s != nil {
		svc.request(s, true)
	}
}

// TouchAhead implements eventstore.TouchAheader: it reads the words a
// Notify reads first (the frontier, the session's scheduling word), so
// that the store's notifications of a chunk of dispatchers miss the caches
// together rather than one by one. It changes nothing.
func (d *dispatcher) TouchAhead() {
	d.received.Load()
	if s := d.session.Load(); s != nil {
		s.sched.w.Load()
	}
}

// storeMax raises a to v if v is larger.
func storeMax(a *atomic.Uint64, v uint64) {
	for {
		old := a.Load()
		if v <= old || a.CompareAndSwap(old, v) {
			return
		}
	}
}

// SlotKey is d's key in the service's index (slots.Keyed).
func (d *dispatcher) SlotKey() common.DispatcherID { return d.id }

// registeredAt is the start-ts of the Register request, to recognise a
// repeated request: the first session's start, which init set before the
// dispatcher was published and nothing changes after (a field of its own
// was eight bytes of every dispatcher).
func (d *dispatcher) registeredAt() common.Ts { return d.first.own.startTs }

package eventservice

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

// gateForTest holds the first session matching match at a hook until
// released, and reports it on held.
type gateForTest struct {
	match   func(*session) bool
	armed   atomic.Bool
	held    chan *session
	release chan struct{}
	once    sync.Once
}

// open releases the held session (idempotent).
func (g *gateForTest) open() { g.once.Do(func() { close(g.release) }) }

func newGate(match func(*session) bool) *gateForTest {
	g := &gateForTest{match: match, held: make(chan *session, 1), release: make(chan struct{})}
	g.armed.Store(true)
	return g
}

func (g *gateForTest) hook(s *session) {
	if g.match(s) && g.armed.CompareAndSwap(true, false) {
		g.held <- s
		<-g.release
	}
}

func isDispatcher(n uint64) func(*session) bool {
	id := common.DispatcherIDFromUint64(n)
	return func(s *session) bool { return s.d.id == id }
}

// preparedLog records every preparation outcome per dispatcher and wakes
// waiters.
type preparedLog struct {
	mu     sync.Mutex
	seq    []string // outcomes of the watched dispatcher, in order
	counts map[common.DispatcherID]int
	ch     chan prepareOutcome
	watch  common.DispatcherID
}

func newPreparedLog(watch uint64) *preparedLog {
	return &preparedLog{counts: map[common.DispatcherID]int{}, ch: make(chan prepareOutcome, 1<<12),
		watch: common.DispatcherIDFromUint64(watch)}
}

func (l *preparedLog) hook(s *session, out prepareOutcome) {
	l.mu.Lock()
	l.counts[s.d.id]++
	if s.d.id == l.watch {
		l.seq = append(l.seq, fmt.Sprintf("%s@sent=%d,recv=%d", outcomeNames[out], s.sent.Load(), s.d.received.Load()))
	}
	l.mu.Unlock()
	if s.d.id == l.watch {
		l.ch <- out
	}
}

// waitFor waits until the watched dispatcher's preparation ends with out.
func (l *preparedLog) waitFor(out prepareOutcome) {
	for got := range l.ch {
		if got == out {
			return
		}
	}
}

func (l *preparedLog) count(n uint64) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.counts[common.DispatcherIDFromUint64(n)]
}

// storeObserver registers a raw store dispatcher on table n and returns a
// channel of the resolved-ts it is notified with. It starts at the
// service's dispatcher's start-ts (10 in these tests) so that it shares its
// subscription (an observer from an earlier ts would get a subscription of
// its own, fed and notified independently). The store notifies the
// subscribers of a subscription in registration order, so when the
// observer (registered after the service's dispatcher) sees ts, the
// service's notifier for that table already returned.
func storeObserver(t *testing.T, h *harness, n uint64) chan common.Ts {
	ch := make(chan common.Ts, 1<<12)
	id := common.DispatcherIDFromUint64(1<<40 + n)
	require.NoError(t, h.store.RegisterDispatcher(id, common.TableSpan(int64(n)), 10, eventstore.NotifierFunc(func(r, _ common.Ts) { ch <- r })))
	st, err := h.store.Dispatcher(id)
	require.NoError(t, err)
	if svcSt, err := h.store.Dispatcher(common.DispatcherIDFromUint64(n)); err == nil {
		require.Equal(t, svcSt.SubscriptionID, st.SubscriptionID, "the observer shares the dispatcher's subscription")
	}
	return ch
}

func waitTs(ch chan common.Ts, ts common.Ts) {
	for r := range ch {
		if r >= ts {
			return
		}
	}
}

// TestNotifyNeverBlocksWithScanQueueSaturated: the only scan worker is held
// inside a scan, the scan channel (capacity one) is full and the
// preparation worker waits for room. The store keeps committing and
// notifying, 100k direct notifications return, the queues stay bounded by
// the number of dispatchers, and after release every dispatcher reaches the
// final resolved-ts with no further notification.
func TestNotifyNeverBlocksWithScanQueueSaturated(t *testing.T) {
	const n = 64
	scanGate := newGate(func(*session) bool { return true })
	full := make(chan struct{}, 1)
	h := newHarness(t, func(o *Options) { o.ScanWorkers, o.ScanQueueSize, o.PrepareWorkers = 1, 1, 1 }, hooks{
		beforeScan: scanGate.hook,
		scanChannelFull: func(*session) {
			select {
			case full <- struct{}{}:
			default:
			}
		},
	}, scanGate)
	h.advanceSchema(1 << 40)
	ids := make([]common.DispatcherID, 0, n)
	for i := uint64(1); i <= n; i++ {
		ids = append(ids, h.register(i, 10))
	}
	observers := make([]chan common.Ts, n)
	for i := range observers {
		observers[i] = storeObserver(t, h, uint64(i+1))
	}
	for i := uint64(1); i <= n; i++ {
		h.push(i, 30, row("a", 15, 20))
	}
	<-scanGate.held
	<-full
	// The scan pipeline is saturated. The store's write path still commits
	// and notifies every table's advances.
	const final = common.Ts(1000)
	for ts := common.Ts(40); ts <= final; ts += 40 {
		for i := uint64(1); i <= n; i++ {
			h.push(i, ts, row("k", ts-2, ts-1))
		}
	}
	for i := range observers {
		waitTs(observers[i], final)
	}
	// Direct notifications (what a store write worker would do) return.
	ds := make([]*dispatcher, n)
	h.svc.mu.RLock()
	for i, id := range ids {
		ds[i] = dispatcherForTest(h.svc, id)
	}
	h.svc.mu.RUnlock()
	for i := range 100_000 {
		ds[i%n].Notify(final, final-1)
	}
	st := h.svc.Stats()
	require.LessOrEqual(t, st.PendingPrepare, n, "preparation queues are bounded by dispatchers")
	require.Equal(t, 2, st.PendingScan, "one session in the channel, one waiting to enter it")
	require.GreaterOrEqual(t, st.Notifications, uint64(100_000))
	require.GreaterOrEqual(t, st.Coalesced, uint64(100_000-n))

	scanGate.open()
	for _, id := range ids {
		es := h.check.waitResolved(id, final)
		require.Len(t, es.rows, 1+int(final/40), "every row exactly once")
	}
}

// TestCoalescingWhileQueued: notifications of a queued session are absorbed
// by the one queue entry.
func TestCoalescingWhileQueued(t *testing.T) {
	prepGate := newGate(isDispatcher(1))
	log := newPreparedLog(2)
	h := newHarness(t, func(o *Options) { o.PrepareWorkers = 1 }, hooks{beforePrepare: prepGate.hook, prepared: log.hook}, prepGate)
	h.register(1, 10)
	<-prepGate.held // the only preparation worker is busy with dispatcher 1
	id2 := h.register(2, 10)
	d2 := h.dispatcher(id2)
	for range 1000 {
		d2.Notify(10, 0)
	}
	require.Equal(t, 1, h.svc.prepQueues[0].len())
	state, _ := d2.session.Load().sched.load()
	require.Equal(t, statePrepareQueued, state)
	prepGate.open()
	require.Equal(t, outcomeNothing, <-log.ch)
	h.check.waitResolved(id2, 10) // the handshake
	require.Equal(t, 1, log.count(2), "1000 notifications, one preparation")
	state, pending := d2.session.Load().sched.load()
	require.Equal(t, stateIdle, state)
	require.False(t, pending)
	require.Zero(t, h.svc.prepQueues[0].len())
}

// TestCoalescingWhilePreparing: notifications during a preparation record
// exactly one follow-up.
func TestCoalescingWhilePreparing(t *testing.T) {
	prepGate := newGate(isDispatcher(1))
	log := newPreparedLog(1)
	h := newHarness(t, nil, hooks{beforePrepare: prepGate.hook, prepared: log.hook}, prepGate)
	id := h.register(1, 10)
	s := <-prepGate.held
	for range 1000 {
		s.d.Notify(10, 0)
	}
	state, pending := s.sched.load()
	require.Equal(t, statePreparing, state)
	require.True(t, pending)
	prepGate.open()
	<-log.ch // the held preparation
	<-log.ch // exactly one follow-up
	h.check.waitResolved(id, 10)
	require.Equal(t, 2, log.count(1))
	state, pending = s.sched.load()
	require.Equal(t, stateIdle, state)
	require.False(t, pending)
}

// TestCoalescingWhileScanning: notifications during a scan record exactly
// one follow-up, which reads the latest frontier.
func TestCoalescingWhileScanning(t *testing.T) {
	scanGate := newGate(isDispatcher(1))
	log := newPreparedLog(1)
	h := newHarness(t, nil, hooks{beforeScan: scanGate.hook, prepared: log.hook}, scanGate)
	h.advanceSchema(1 << 40)
	id := h.register(1, 10)
	obs := storeObserver(t, h, 1)
	h.push(1, 30, row("a", 15, 20))
	s := <-scanGate.held
	log.waitFor(outcomeScan) // up to the preparation that queued the held scan
	before := log.count(1)
	h.push(1, 50, row("b", 35, 40))
	waitTs(obs, 50)
	for range 1000 {
		s.d.Notify(50, 40)
	}
	_, pending := s.sched.load()
	require.True(t, pending)
	scanGate.open()
	// The held scan reads the frontier when it starts, so it already
	// covers (10, 50]; the one follow-up finds nothing left.
	es := h.check.waitResolved(id, 50)
	require.Equal(t, []string{"a", "b"}, keys(es.rows))
	out := <-log.ch
	snap, _ := h.svc.Inspect(id)
	log.mu.Lock()
	seq := log.seq
	log.mu.Unlock()
	require.Equal(t, outcomeNothing, out, "follow-up outcome %s; %+v; progress %+v; outcomes %v", outcomeNames[out], snap, s.own.progress, seq)
	require.Equal(t, before+1, log.count(1), "one follow-up preparation after the scan")
	state, pending := s.sched.load()
	require.Equal(t, stateIdle, state)
	require.False(t, pending)
}

// TestSchemaBlockedRetriesWithoutNotify: a dispatcher held by the schema
// frontier parks and catches up when the frontier advances, without any
// store notification, with each DDL after the rows of its commit-ts.
func TestSchemaBlockedRetriesWithoutNotify(t *testing.T) {
	log := newPreparedLog(1)
	h := newHarness(t, nil, hooks{prepared: log.hook})
	id := h.register(1, 10)
	obs := storeObserver(t, h, 1)
	h.push(1, 40, row("a", 15, 20), row("b", 21, 30))
	waitTs(obs, 40)
	log.waitFor(outcomeSchemaBlocked)
	require.Equal(t, 1, h.svc.Stats().SchemaBlocked)
	notifications := h.svc.Stats().Notifications

	require.NoError(t, h.schema.AddDDL(schemastore.DDL{TableID: 1, CommitTs: 20, Query: "ddl@20"}))
	h.advanceSchema(25) // partial: up to 25, then blocked again
	es := h.check.waitResolved(id, 25)
	require.Equal(t, []string{"a"}, keys(es.rows))
	require.Len(t, es.ddls, 1)
	h.advanceSchema(100)
	es = h.check.waitResolved(id, 40)
	require.Equal(t, []string{"a", "b"}, keys(es.rows))
	require.Equal(t, notifications, h.svc.Stats().Notifications, "no store notification was needed")
}

// TestRemovedWhileParkingLeavesTheBlockedSet: a dispatcher removed after
// its owner moved it to schemaBlocked but before the owner put it into the
// blocked set (Remove's own removal from the set finds nothing there) does
// not stay in the set, where it would wait for a frontier that may never
// come (a dropped table).
func TestRemovedWhileParkingLeavesTheBlockedSet(t *testing.T) {
	held, release := make(chan struct{}), make(chan struct{})
	parked := make(chan struct{}, 1)
	var once sync.Once
	h := newHarness(t, nil, hooks{
		beforePark: func(*session) {
			once.Do(func() {
				close(held)
				<-release
			})
		},
		// prepared runs after the preparation's transition, park included.
		prepared: func(_ *session, out prepareOutcome) {
			if out == outcomeSchemaBlocked {
				select {
				case parked <- struct{}{}:
				default:
				}
			}
		},
	})
	defer func() {
		select {
		case <-release:
		default:
			close(release)
		}
	}()
	id := h.register(1, 10)
	h.push(1, 40, row("a", 15, 20)) // the schema frontier is at 1: blocked
	<-held
	require.NoError(t, h.remove(id))
	close(release)
	<-parked // the owner finished parking the removed session
	require.Zero(t, h.svc.blocked.len(), "the removed session left the blocked set")
}

// TestFastPathNeverSkipsRowsSharingACommitTs: with one row per scan task,
// scans stop between transactions that share a commit-ts; every row is
// still delivered exactly once.
func TestFastPathNeverSkipsRowsSharingACommitTs(t *testing.T) {
	h := newHarness(t, func(o *Options) { o.ScanLimitRows = 1 }, hooks{})
	h.advanceSchema(1 << 40)
	id := h.register(1, 10)
	h.push(1, 40, row("c", 11, 20), row("b", 12, 20), row("a", 13, 20), row("d", 25, 30))
	es := h.check.waitResolved(id, 40)
	require.Equal(t, []string{"c", "b", "a", "d"}, keys(es.rows))
	require.Positive(t, testutilCounter(h.svc.metrics.interruptedScans))
}

// TestDecideFastPathIsStrict checks the fast-path bound directly.
func TestDecideFastPathIsStrict(t *testing.T) {
	h := newHarness(t, nil, hooks{})
	h.advanceSchema(1 << 40)
	svc := h.svc
	d := &dispatcher{id: common.DispatcherIDFromUint64(7), span: common.Pack(common.TableSpan(7)), svc: svc}
	d.target = h.targetFor(t)
	s := newSession(d, 1, 20)
	s.own.progress.seq = 1 // handshake done
	d.received.Store(30)
	d.maxCommit.Store(20) // the last row is at the commit-ts already delivered
	require.Equal(t, outcomeFastPath, decideOf(svc, s))
	require.Equal(t, common.Ts(30), s.own.progress.resolved)

	s = newSession(d, 1, 20)
	s.own.progress.seq = 1
	d.maxCommit.Store(21) // one row right above the delivered commit-ts
	require.Equal(t, outcomeScan, decideOf(svc, s))
	require.Equal(t, common.Ts(20), s.own.progress.resolved)

	require.NoError(t, h.schema.AddDDL(schemastore.DDL{TableID: 7, CommitTs: h.schema.ResolvedTs() + 1}))
	require.NoError(t, h.schema.AdvanceResolvedTs(h.schema.ResolvedTs()+2))
	s = newSession(d, 1, 20)
	s.own.progress.seq = 1
	d.maxCommit.Store(0)
	d.received.Store(1 << 41)
	require.Equal(t, outcomeScan, decideOf(svc, s), "a DDL in range forces a scan")
}

// decideOf is preparation's step for s (handshake done) on what the
// service observes, without carrying its effects out: the outcome its end
// effect counts.
func decideOf(svc *Service, s *session) prepareOutcome {
	fx := s.own.step(input{kind: inPrepare, obs: svc.observe(s)}, nil)
	return prepareOutcome(fx[len(fx)-1].outcome)
}

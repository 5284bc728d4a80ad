package eventservice

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// dropNextDMLForTest silently drops the next send that carries a DMLBatch
// once armed, like a lossy network: Send reports success.
type dropNextDMLForTest struct {
	inner   messaging.Transport
	armed   atomic.Bool
	dropped chan struct{}
}

func (d *dropNextDMLForTest) Send(to messaging.Target, msgs []messaging.Message) error {
	for _, m := range msgs {
		if _, ok := m.(*messaging.DMLBatch); ok && d.armed.CompareAndSwap(true, false) {
			close(d.dropped)
			return nil
		}
	}
	return d.inner.Send(to, msgs)
}

// TestKeepaliveRevealsADroppedLastMessage: the last message of a dispatcher
// is dropped; no later data would reveal the gap, but the keepalive
// resolved-ts (carrying the current seq) does.
func TestKeepaliveRevealsADroppedLastMessage(t *testing.T) {
	drop := &dropNextDMLForTest{dropped: make(chan struct{})}
	fc := clock.NewFake(time.Unix(1_000_000, 0))
	scanned := make(chan struct{}, 16)
	h := newHarness(t, func(o *Options) {
		o.Clock = fc
		drop.inner = o.Transport
		o.Transport = drop
	}, hooks{scanned: func(*session, scanOutcome) { scanned <- struct{}{} }})
	h.advanceSchema(1 << 40)
	id := h.register(1, 10)
	h.check.waitResolved(id, 10)
	drop.armed.Store(true)
	h.push(1, 40, row("a", 15, 20))
	<-drop.dropped
	<-scanned // the scan published the progress its lost message carried
	require.Zero(t, testutilCounter(h.svc.metrics.keepalives))
	fc.Advance(h.svc.opts.SignalInterval) // one keepalive interval, unacknowledged
	h.check.waitFor("the gap to show", func() bool {
		for _, v := range h.check.violations {
			if strings.Contains(v, "resolved seq 2 ahead of 1") {
				return true
			}
		}
		return false
	})
	require.Positive(t, testutilCounter(h.svc.metrics.keepalives))
	h.check.mu.Lock()
	h.check.violations = nil // the gap was the point; a collector would reset here
	h.check.mu.Unlock()
}

// TestKeepaliveOnlyForUnacknowledgedProgress drives the keepalive decision
// directly with explicit times.
func TestKeepaliveOnlyForUnacknowledgedProgress(t *testing.T) {
	scanned := make(chan scanOutcome, 16)
	h := newHarness(t, func(o *Options) { o.SignalInterval = time.Hour }, hooks{
		scanned: func(_ *session, out scanOutcome) { scanned <- out },
	})
	h.advanceSchema(1 << 40)
	id := h.register(1, 10)
	h.push(1, 40, row("a", 15, 20))
	require.Equal(t, scanDone, <-scanned) // the scan published its progress
	d := h.dispatcher(id)
	ts, _, at := d.session.Load().published()
	require.Equal(t, common.Ts(40), ts)

	h.svc.keepalive(d.session.Load(), at.Add(30*time.Minute))
	require.Zero(t, testutilCounter(h.svc.metrics.keepalives), "published recently")
	h.svc.keepalive(d.session.Load(), at.Add(time.Hour))
	require.Equal(t, 1.0, testutilCounter(h.svc.metrics.keepalives), "unacknowledged for an interval")
	h.svc.keepalive(d.session.Load(), at.Add(90*time.Minute))
	require.Equal(t, 1.0, testutilCounter(h.svc.metrics.keepalives), "rate-limited to one per interval")
	require.NoError(t, h.heartbeat(id, 1, 40))
	h.svc.keepalive(d.session.Load(), at.Add(5*time.Hour))
	require.Equal(t, 1.0, testutilCounter(h.svc.metrics.keepalives), "acknowledged: nothing to re-send")
	h.check.waitResolved(id, 40)
}

// TestKeepaliveWaitsWhileWorkIsInThePipeline: unacknowledged progress gets
// no keepalive while the session is being scanned (that work publishes
// anew; under overload acknowledgements lag and keepalives only added
// load); once it is idle again and still unacknowledged, it does.
func TestKeepaliveWaitsWhileWorkIsInThePipeline(t *testing.T) {
	scanned := make(chan scanOutcome, 16)
	inScan, release := make(chan struct{}), make(chan struct{})
	var hold atomic.Bool
	h := newHarness(t, func(o *Options) { o.SignalInterval = time.Hour }, hooks{
		scanned: func(_ *session, out scanOutcome) { scanned <- out },
		beforeScan: func(*session) {
			if hold.CompareAndSwap(true, false) {
				close(inScan)
				<-release
			}
		},
	})
	// Registered after the harness's: runs first, so a failed assertion
	// does not leave the scan worker held while the service closes.
	var released atomic.Bool
	unhold := func() {
		if released.CompareAndSwap(false, true) {
			close(release)
		}
	}
	t.Cleanup(unhold)
	h.advanceSchema(1 << 40)
	id := h.register(1, 10)
	h.push(1, 40, row("a", 15, 20))
	require.Equal(t, scanDone, <-scanned)
	d := h.dispatcher(id)
	s := d.session.Load()
	_, _, at := s.published()

	hold.Store(true)
	h.push(1, 60, row("b", 45, 50))
	<-inScan // the session is scanning, its progress (40) unacknowledged
	h.svc.keepalive(s, at.Add(2*time.Hour))
	require.Zero(t, testutilCounter(h.svc.metrics.keepalives), "work in the pipeline will publish anew")
	require.Equal(t, h.svc.kaSet.gen.Load(), s.kaGen.Load(), "looked at again next interval")

	unhold()
	require.Equal(t, scanDone, <-scanned)
	_, _, at = s.published()
	h.svc.keepalive(s, at.Add(2*time.Hour))
	require.Equal(t, 1.0, testutilCounter(h.svc.metrics.keepalives), "idle and unacknowledged for an interval")
	h.check.waitResolved(id, 60)
}

// TestKeepaliveReachesAParkedSession: a session parked at the schema
// frontier may stay parked for good, and its last message may be the lost
// one, so unacknowledged progress gets its keepalive there (the model test
// found this when parked sessions were skipped like scanning ones).
func TestKeepaliveReachesAParkedSession(t *testing.T) {
	blocked := make(chan struct{}, 16)
	h := newHarness(t, func(o *Options) { o.SignalInterval = time.Hour }, hooks{
		prepared: func(_ *session, out prepareOutcome) {
			if out == outcomeSchemaBlocked {
				blocked <- struct{}{}
			}
		},
	})
	h.advanceSchema(30)
	id := h.register(1, 10)
	h.push(1, 40) // resolved beyond the schema frontier: sent up to 30, then parked
	<-blocked
	s := h.dispatcher(id).session.Load()
	st, _ := s.sched.load()
	require.Equal(t, stateSchemaBlocked, st)
	h.check.waitResolved(id, 30) // delivered: no longer waiting in the resolved set
	ts, _, at := s.published()
	require.Equal(t, common.Ts(30), ts)
	h.svc.keepalive(s, at.Add(2*time.Hour))
	require.Equal(t, 1.0, testutilCounter(h.svc.metrics.keepalives), "parked and unacknowledged: keepalive")
}

// TestKeepaliveFollowsChange: the keepalive loop examines only sessions
// that published progress in the interval before (or still wait for an
// acknowledgement), never every dispatcher: once every collector
// acknowledged and nothing moves, a round examines nothing.
func TestKeepaliveFollowsChange(t *testing.T) {
	fc := clock.NewFake(time.Unix(1_000_000, 0))
	rounds := make(chan int, 16)
	const n = 100
	// The hooks run after a worker's transition, which follows its
	// publish: a message seen by the checker may not be published yet.
	prepared, scanned := make(chan struct{}, n), make(chan struct{}, n)
	h := newHarness(t, func(o *Options) { o.Clock = fc }, hooks{keepaliveRound: func(n int) { rounds <- n },
		prepared: func(*session, prepareOutcome) { signal(prepared) },
		scanned:  func(*session, scanOutcome) { signal(scanned) }})
	h.advanceSchema(1 << 40)
	ids := make([]common.DispatcherID, n)
	for i := range ids {
		ids[i] = h.register(uint64(i+1), 10)
	}
	for range n {
		<-prepared // each published its handshake
	}
	for _, id := range ids {
		h.check.waitResolved(id, 10)
		require.NoError(t, h.heartbeat(id, 1, 10))
	}
	fc.Advance(h.svc.opts.SignalInterval)
	require.Equal(t, n, <-rounds, "the round after the handshakes examines those that published")
	require.Zero(t, testutilCounter(h.svc.metrics.keepalives), "all acknowledged")
	fc.Advance(h.svc.opts.SignalInterval)
	require.Zero(t, <-rounds, "nothing published, nothing unacknowledged: nothing examined")

	h.push(1, 40, row("a", 15, 20)) // one dispatcher moves
	<-scanned                       // its scan published the progress
	h.check.waitResolved(ids[0], 40)
	fc.Advance(h.svc.opts.SignalInterval)
	require.Equal(t, 1, <-rounds)
	require.Equal(t, 1.0, testutilCounter(h.svc.metrics.keepalives), "its progress is unacknowledged")
}

// signal sends on ch without blocking a worker (extra signals are dropped).
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// TestKeepaliveCarryOverListsASessionOnce: the round notes its carry-overs
// in one go, after examining them; a session that published meanwhile is
// already in the new list and must not be listed twice (the list would
// grow by the carry-overs every round).
func TestKeepaliveCarryOverListsASessionOnce(t *testing.T) {
	var k keepaliveSet
	k.gen.Store(1)
	a, b := &session{}, &session{}
	k.note(a)
	k.note(b)
	prev := k.swap(nil)
	require.Len(t, prev, 2)
	k.note(a) // a publishes again between its examination and the carry-over
	k.noteAll(prev)
	require.Equal(t, 2, k.len(), "a once, b once")
	k.noteAll(prev)
	require.Equal(t, 2, k.len(), "noting again lists nobody twice")
}

package eventservice

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// TestAFrontierPassingWhileTheOwnerParksStillRequeuesTheSession: no lost
// wakeup between an owner's decision to park and the schema-retry loop.
//
// The interleaving: the owner observes the schema frontier at 15, below
// what the store has (30), and decides to park the session at 15; before
// it puts the session into the blocked set (pointBeforePark), the frontier
// moves to 100 and the retry round that advance woke runs and finds the
// set empty. That round was the advance's only wakeup, and no store
// notification follows; so only park's own second read of the frontier can
// re-queue the session. Without it the session would wait for the next
// schema advance, which may never come.
//
// The service is never started: as in the session traces, the test
// goroutine plays the preparation worker, the scan worker and the retry
// loop, so the interleaving is exact (the store and the transport are the
// traces' scripted ones).
func TestAFrontierPassingWhileTheOwnerParksStillRequeuesTheSession(t *testing.T) {
	w := newTraceWorld(t)
	defer w.close()
	svc := w.svc
	require.NoError(t, w.schema.AdvanceResolvedTs(15))
	id := common.DispatcherIDFromUint64(1)
	require.NoError(t, svc.Register(context.Background(), messaging.RegisterRequest{Dispatcher: id, Registration: 1,
		Span: common.TableSpan(1), StartTs: 10, Target: traceTarget}))

	// playWorkers runs preparations and scans until neither has work.
	playWorkers := func() {
		for {
			popped, ok := svc.prepareNext(w.prepare, svc.prepQueues[0])
			require.True(t, ok)
			if popped {
				continue
			}
			select {
			case s := <-svc.scanCh:
				svc.scanOne(w.scan, s)
				continue
			default:
			}
			return
		}
	}
	playWorkers() // the handshake
	s := dispatcherForTest(svc, id).session.Load()
	st, _ := s.sched.load()
	require.Equal(t, stateIdle.String(), st.String())

	parks := 0
	at := svc.knobs.at
	svc.knobs.at = func(p point, ps *session, d *dispatcher) {
		at(p, ps, d)
		if p != pointBeforePark {
			return
		}
		parks++
		require.Same(t, s, ps)
		require.Equal(t, common.Ts(15), common.Ts(ps.blockedAt.Load()), "the owner parks at the frontier it observed")
		// The frontier passes what the session waits for, and the round of
		// the retry loop that this advance wakes runs now: the session is
		// not in the set yet, so it finds nothing to re-queue.
		require.NoError(t, w.schema.AdvanceResolvedTs(100))
		svc.retryBlocked(nil)
		require.Zero(t, svc.blocked.len())
		st, _ := ps.sched.load()
		require.Equal(t, stateSchemaBlocked.String(), st.String(), "the retry round did not see the session")
	}

	w.store.add(id, common.Row{Op: common.OpPut, Key: []byte("a"), Value: []byte("v"), StartTs: 19, CommitTs: 20})
	w.store.notify(id, 30, 20) // the last store notification of the test
	playWorkers()
	svc.knobs.at = at

	require.Equal(t, 1, parks, "the owner parked the session once")
	st, _ = s.sched.load()
	require.Equal(t, stateIdle.String(), st.String(), "the session is not left parked behind a frontier that passed")
	require.Zero(t, svc.blocked.len())
	require.Equal(t, common.Ts(30), s.own.progress.resolved, "the session reaches the store's resolved-ts with no further wakeup")
	require.Equal(t, uint64(2), s.own.progress.seq, "the row went out (handshake #1, its batch #2)")
}

package eventservice

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

func TestEndToEndRowsDDLsAndResolved(t *testing.T) {
	// Preparations end after what they deliver is visible (a scan's rows
	// are sent before its end is carried out), so the test waits for the
	// outcome of the preparation that delivered, not for the delivery.
	outcomes := make(chan prepareOutcome, 1024)
	h := newHarness(t, nil, hooks{prepared: func(_ *session, o prepareOutcome) { outcomes <- o }})
	waitOutcome := func(want ...prepareOutcome) prepareOutcome {
		t.Helper()
		for {
			select {
			case o := <-outcomes:
				if slices.Contains(want, o) {
					return o
				}
			case <-time.After(30 * time.Second): // a hang is the failure; no timing is asserted
				t.Fatalf("no preparation ended with %v", want)
			}
		}
	}
	id := h.register(1, 10)
	st := h.check.waitResolved(id, 10)
	require.Equal(t, common.Ts(10), st.startTs)

	require.NoError(t, h.schema.AddDDL(schemastore.DDL{TableID: 1, CommitTs: 20, Query: "alter 20"}))
	require.NoError(t, h.schema.AddDDL(schemastore.DDL{TableID: 1, CommitTs: 25, Query: "alter 25"}))
	h.advanceSchema(100)
	h.push(1, 40, row("a", 15, 20), row("b", 16, 20), row("c", 21, 30))
	st = h.check.waitResolved(id, 40)
	waitOutcome(outcomeScan)
	require.Equal(t, []string{"a", "b", "c"}, keys(st.rows))
	require.Len(t, st.ddls, 2)
	require.Equal(t, common.Ts(20), st.ddls[0].CommitTs)

	// Resolved-only advance: the fast path, no scan.
	scans := testutilCounter(h.svc.metrics.prepareOutcomes[outcomeScan])
	fast := testutilCounter(h.svc.metrics.prepareOutcomes[outcomeFastPath])
	h.push(1, 60)
	h.check.waitResolved(id, 60)
	require.Equal(t, outcomeFastPath, waitOutcome(outcomeFastPath, outcomeScan), "the advance to 60 was prepared without a scan")
	require.Equal(t, scans, testutilCounter(h.svc.metrics.prepareOutcomes[outcomeScan]), "no scan for a resolved-only advance")
	require.Greater(t, testutilCounter(h.svc.metrics.prepareOutcomes[outcomeFastPath]), fast)
}

// TestScanLimitsStopAtBoundariesAndSplitLargeTxnsExactly: with tiny task
// limits, scans stop at transaction boundaries (including between
// transactions sharing a commit-ts) and split a transaction larger than
// LargeTxnSplitBytes at a row; the resumes neither repeat nor skip a row,
// and no resolved-ts at or above a split transaction's commit-ts is sent
// before its last row (the stream checker enforces that).
func TestScanLimitsStopAtBoundariesAndSplitLargeTxnsExactly(t *testing.T) {
	h := newHarness(t, func(o *Options) {
		o.ScanLimitRows, o.ScanLimitBytes, o.LargeTxnSplitBytes, o.BatchRows = 3, 64, 64, 2
	}, hooks{})
	h.advanceSchema(1 << 40)
	id := h.register(1, 10)
	var rows []common.Row
	var want []string
	add := func(key string, startTs, commitTs common.Ts) {
		rows = append(rows, row(key, startTs, commitTs))
		want = append(want, key)
	}
	add("t1-a", 11, 20)
	add("t1-b", 11, 20)
	add("t2-a", 12, 20) // a second transaction at the same commit-ts
	for i := range 25 {
		add(fmt.Sprintf("big-%02d", i), 21, 30) // one transaction of 25 rows
	}
	add("t4-a", 31, 40)
	h.push(1, 50, rows...)
	es := h.check.waitResolved(id, 50)
	require.Equal(t, want, keys(es.rows))
	require.Positive(t, es.partials, "the large transaction was split")
	require.Positive(t, testutilCounter(h.svc.metrics.interruptedScans))
}

// TestResolvedBatchesShrinkToTheTargetsCapacity: a target whose inbox
// holds fewer messages than a ResolvedBatch of every advance has entries
// (a batch weighs its entries) answers it with ErrBatchTooLarge; the
// target's pump sends smaller batches instead of retrying the same one
// forever, and every dispatcher reaches the final resolved-ts. (A byte
// bound never refuses for good: an oversized batch goes in alone.)
func TestResolvedBatchesShrinkToTheTargetsCapacity(t *testing.T) {
	// Capacity 16: a batch of 40 entries can never fit.
	small, err := messaging.NewInProcess(messaging.InProcessOptions{Capacity: 16})
	require.NoError(t, err)
	defer small.Close()
	inbox, err := small.Register(testTarget)
	require.NoError(t, err)
	h := newHarness(t, func(o *Options) { o.Transport = small }, hooks{})
	check := newStreamChecker(t, inbox)
	h.check = check // testTarget's messages go to this inbox
	h.advanceSchema(1 << 40)
	const n = 40
	for i := uint64(1); i <= n; i++ {
		h.register(i, 10)
	}
	for i := uint64(1); i <= n; i++ {
		check.waitResolved(common.DispatcherIDFromUint64(i), 10)
	}
	for i := uint64(1); i <= n; i++ {
		h.push(i, 50) // resolved-only: every advance goes through the resolved set
	}
	for i := uint64(1); i <= n; i++ {
		check.waitResolved(common.DispatcherIDFromUint64(i), 50)
	}
	require.Positive(t, testutilCounter(h.svc.metrics.sendRefusals.WithLabelValues("too_large")))
	check.assertClean()
}

// TestQueuedResolvedOfARemovedDispatcherIsNotDelivered: a resolved-ts
// advance still queued for a removed dispatcher must not be delivered to,
// nor win a merge against, a new dispatcher registered under the same ID
// and epoch (its collector would take it for its own progress and skip
// rows below it).
func TestQueuedResolvedOfARemovedDispatcherIsNotDelivered(t *testing.T) {
	h := newHarness(t, nil, hooks{})
	h.advanceSchema(1 << 40)
	id := h.register(1, 10)
	h.check.waitResolved(id, 10)
	old := resolvedValue{s: h.dispatcher(id).session.Load(), epoch: 1, seq: 1, ts: 500}
	require.NoError(t, h.remove(id))
	// The new incarnation reports to a target of its own, so the strict
	// stream checker of testTarget does not see a second handshake of
	// epoch 1 (a collector would start a new stream for it).
	_, err := h.inproc.Register("other")
	require.NoError(t, err)
	require.NoError(t, h.registerOn(id, 1, 300, "other"))
	fresh := resolvedValue{s: h.dispatcher(id).session.Load(), epoch: 1, seq: 1, ts: 300}

	require.False(t, old.current(), "the removed dispatcher's advance is dropped")
	require.True(t, fresh.current())
	require.Equal(t, fresh, newerResolved(old, fresh))
	require.Equal(t, fresh, newerResolved(fresh, old), "a retired session's late add does not win")
}

// panickingStoreForTest is an EventStore whose RegisterDispatcher panics
// (the embedder's store is the edge this test is about).
type panickingStoreForTest struct{ nopStoreForBench }

func (panickingStoreForTest) RegisterDispatcher(common.DispatcherID, common.Span, common.Ts, eventstore.Notifier) error {
	panic("store bug")
}

// TestAPanickingStoreLeavesNoLockHeld: a store that panics inside
// RegisterDispatcher must not leave the dispatcher's lock held (it was
// unlocked by hand after the call, so a panic skipped it, and Close then
// hung on it).
func TestAPanickingStoreLeavesNoLockHeld(t *testing.T) {
	schema, err := schemastore.NewMemory(schemastore.MemoryOptions{InitialResolvedTs: 1})
	require.NoError(t, err)
	svc, err := New(Options{Store: panickingStoreForTest{}, Schema: schema, Transport: acceptAllForBench{}})
	require.NoError(t, err)
	require.NoError(t, svc.Start())
	id := common.DispatcherIDFromUint64(1)
	require.Panics(t, func() {
		_ = svc.Register(context.Background(), messaging.RegisterRequest{Dispatcher: id, Registration: 1, Span: common.TableSpan(1), Target: "t"})
	})
	svc.mu.RLock()
	d := dispatcherForTest(svc, id)
	svc.mu.RUnlock()
	require.True(t, d.mu.TryLock(), "the dispatcher's lock was released by defer")
	d.mu.Unlock()
	require.NoError(t, svc.Close())
}

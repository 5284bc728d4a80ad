package eventcollector

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventservice"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/schemastore"
	"github.com/cdcflow/eventservice/pkg/upstream"
)

// stackForTest is a collector on the real stack: the manual upstream, the
// pebble store (in memory), the in-memory schema store, the in-process
// transport (optionally wrapped), the event service. The collector's clock
// is fake, so heartbeats happen only on tick.
type stackForTest struct {
	t      *testing.T
	up     *upstream.Manual
	store  *eventstore.Store
	schema *schemastore.Memory
	inproc *messaging.InProcess
	inbox  *messaging.Inbox
	svc    *eventservice.Service
	mem    *MemorySink
	check  *checkingSinkForTest
	clk    *clock.Fake
	coll   *Collector
	ticks  chan struct{}
	done   chan struct{}
	// handled is closed and replaced after each message the collector
	// handled (its state is updated by then).
	handled struct {
		sync.Mutex
		ch chan struct{}
	}
}

// handledCh returns the channel closed after the next handled message.
func (h *stackForTest) handledCh() <-chan struct{} {
	h.handled.Lock()
	defer h.handled.Unlock()
	return h.handled.ch
}

type stackConfig struct {
	capacity  int                                           // inbox capacity; default 1<<12
	transport func(messaging.Transport) messaging.Transport // wraps the service's transport
	svc       func(*eventservice.Options)
	coll      func(*Options)
	sink      func(Sink) Sink // wraps the checking sink
}

func newStack(t *testing.T, cfg stackConfig) *stackForTest {
	t.Helper()
	h := &stackForTest{t: t, up: upstream.NewManual(), mem: NewMemorySink(), clk: clock.NewFake(t0),
		ticks: make(chan struct{}, 64), done: make(chan struct{})}
	var err error
	h.store, err = eventstore.Open(eventstore.Options{Upstream: h.up})
	require.NoError(t, err)
	require.NoError(t, h.store.Start())
	h.schema, err = schemastore.NewMemory(schemastore.MemoryOptions{InitialResolvedTs: 1})
	require.NoError(t, err)
	if cfg.capacity == 0 {
		cfg.capacity = 1 << 12
	}
	h.inproc, err = messaging.NewInProcess(messaging.InProcessOptions{Capacity: cfg.capacity})
	require.NoError(t, err)
	h.inbox, err = h.inproc.Register(testTarget)
	require.NoError(t, err)
	var tr messaging.Transport = h.inproc
	if cfg.transport != nil {
		tr = cfg.transport(tr)
	}
	sopts := eventservice.Options{Store: h.store, Schema: h.schema, Transport: tr,
		BackoffBase: time.Millisecond, BackoffMax: 5 * time.Millisecond}
	if cfg.svc != nil {
		cfg.svc(&sopts)
	}
	h.svc, err = eventservice.New(sopts)
	require.NoError(t, err)
	require.NoError(t, h.svc.Start())

	h.check = &checkingSinkForTest{mem: h.mem, expected: map[common.DispatcherID][]common.Row{}}
	var sink Sink = h.check
	if cfg.sink != nil {
		sink = cfg.sink(sink)
	}
	copts := Options{Service: h.svc, Inbox: h.inbox, Sink: sink, Clock: h.clk, HeartbeatInterval: time.Second}
	if cfg.coll != nil {
		cfg.coll(&copts)
	}
	h.coll, err = New(copts)
	require.NoError(t, err)
	h.handled.ch = make(chan struct{})
	h.coll.knobs.afterHandle = func(messaging.Message) {
		h.handled.Lock()
		close(h.handled.ch)
		h.handled.ch = make(chan struct{})
		h.handled.Unlock()
	}
	h.coll.knobs.afterTick = func() {
		select {
		case h.ticks <- struct{}{}:
		case <-h.done:
		}
	}
	require.NoError(t, h.coll.Start())
	t.Cleanup(h.close)
	return h
}

// close stops everything in dependency order: collector, service, store,
// transport; then checks what the checking sink saw.
func (h *stackForTest) close() {
	close(h.done)
	require.NoError(h.t, h.coll.Close())
	require.NoError(h.t, h.coll.Close(), "idempotent")
	require.NoError(h.t, h.svc.Close())
	require.NoError(h.t, h.store.Close())
	h.inproc.Close()
	require.Empty(h.t, h.check.violations())
}

// add adds dispatcher n on table n from startTs.
func (h *stackForTest) add(n uint64, startTs common.Ts) common.DispatcherID {
	h.t.Helper()
	id := did(n)
	require.NoError(h.t, h.coll.AddDispatcher(context.Background(), id, common.TableSpan(int64(n)), startTs))
	return id
}

// push feeds table n's rows and a resolved-ts to the upstream, recording
// the rows as expected for dispatcher n first (so a checkpoint can never
// be checked against rows not yet recorded).
func (h *stackForTest) push(n uint64, resolvedTs common.Ts, rows ...common.Row) {
	h.t.Helper()
	h.check.expect(did(n), rows)
	require.NoError(h.t, h.up.Push(context.Background(), common.TableSpan(int64(n)), eventstore.Batch{Rows: rows, ResolvedTs: resolvedTs}))
}

func (h *stackForTest) advanceSchema(ts common.Ts) {
	h.t.Helper()
	require.NoError(h.t, h.schema.AdvanceResolvedTs(ts))
}

// waitCheckpoint waits until the sink confirmed ts for id and the collector
// recorded it (it does so after the sink call returns, so the sink alone
// can be seen ahead of the collector's state).
func (h *stackForTest) waitCheckpoint(id common.DispatcherID, ts common.Ts) {
	h.t.Helper()
	ctx := testCtx(h.t)
	err := h.mem.WaitCheckpoint(ctx, id, ts)
	require.NoError(h.t, err, "checkpoint of %v: %v, want %v; stats %+v", id, h.mem.CheckpointOf(id), ts, h.coll.Stats())
	for {
		ch := h.handledCh()
		if st, err := h.coll.Dispatcher(id); err == nil && st.Checkpoint >= ts {
			return
		}
		select {
		case <-ch:
		case <-ctx.Done():
			h.t.Fatalf("the collector did not record checkpoint %v of %v", ts, id)
		}
	}
}

// tick advances the collector's clock one heartbeat interval and waits for
// the round of heartbeats to finish.
func (h *stackForTest) tick() {
	h.t.Helper()
	h.clk.Advance(h.coll.opts.HeartbeatInterval)
	select {
	case <-h.ticks:
	case <-time.After(waitTimeout):
		h.t.Fatal("timed out waiting for a heartbeat round")
	}
}

// assertExactlyUpstream checks that id's deduplicated sink content is the
// upstream's rows, and that no epoch applied a row twice or out of order.
func (h *stackForTest) assertExactlyUpstream(id common.DispatcherID) {
	h.t.Helper()
	want := h.check.expectedRows(id)
	got := h.mem.Deduplicated(id)
	require.Equal(h.t, rowIDs(want), rowIDs(got))
	assertEpochsClean(h.t, h.mem.Epochs(id))
}

// assertEpochsClean: within each epoch, rows strictly above the start-ts,
// in commit-ts order, none twice; checkpoints strictly increasing; epochs
// increasing.
func assertEpochsClean(t *testing.T, epochs []EpochRecord) {
	t.Helper()
	var lastEpoch uint64
	var lastCheckpoint common.Ts
	for _, e := range epochs {
		require.Greater(t, e.Epoch, lastEpoch)
		lastEpoch = e.Epoch
		seen := map[string]bool{}
		var prev common.Ts
		for _, r := range e.Rows {
			id := rowID(r)
			require.False(t, seen[id], "epoch %d applied %s twice", e.Epoch, id)
			seen[id] = true
			require.Greater(t, r.CommitTs, e.StartTs, "epoch %d row %s", e.Epoch, id)
			require.GreaterOrEqual(t, r.CommitTs, prev, "epoch %d row %s out of order", e.Epoch, id)
			prev = r.CommitTs
		}
		require.Zero(t, e.CheckpointRegressions, "epoch %d: a checkpoint not above the previous one", e.Epoch)
		if e.Checkpoints > 0 {
			require.Greater(t, e.LastCheckpoint, lastCheckpoint)
			lastCheckpoint = e.LastCheckpoint
		}
	}
}

func rowID(r common.Row) string { return fmt.Sprintf("%d/%d/%s", r.CommitTs, r.StartTs, r.Key) }

func rowIDs(rows []common.Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = rowID(r)
	}
	return out
}

// checkingSinkForTest forwards to a MemorySink and, at every Checkpoint(ts),
// checks the promise behind it: every upstream row of the dispatcher at or
// below ts has been applied (deduplicated across epochs), and nothing else.
type checkingSinkForTest struct {
	mem *MemorySink

	mu       sync.Mutex
	expected map[common.DispatcherID][]common.Row
	problems []string
}

func (c *checkingSinkForTest) expect(id common.DispatcherID, rows []common.Row) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expected[id] = append(c.expected[id], rows...)
}

func (c *checkingSinkForTest) expectedRows(id common.DispatcherID) []common.Row {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := slices.Clone(c.expected[id])
	SortRows(out)
	return out
}

func (c *checkingSinkForTest) violations() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.problems)
}

func (c *checkingSinkForTest) BeginEpoch(id common.DispatcherID, epoch uint64, startTs common.Ts) error {
	return c.mem.BeginEpoch(id, epoch, startTs)
}

func (c *checkingSinkForTest) ApplyRows(id common.DispatcherID, rows []common.Row) error {
	return c.mem.ApplyRows(id, rows)
}

func (c *checkingSinkForTest) ApplyDDL(id common.DispatcherID, ddl *messaging.DDL) error {
	return c.mem.ApplyDDL(id, ddl)
}

func (c *checkingSinkForTest) Checkpoint(id common.DispatcherID, ts common.Ts) error {
	upTo := func(rows []common.Row) []string {
		var out []string
		for _, r := range rows {
			if r.CommitTs <= ts {
				out = append(out, rowID(r))
			}
		}
		return out
	}
	want := upTo(c.expectedRows(id))
	got := upTo(c.mem.Deduplicated(id))
	if !slices.Equal(want, got) {
		c.mu.Lock()
		c.problems = append(c.problems, fmt.Sprintf("%v checkpoint %v: applied %v, upstream %v", id, ts, got, want))
		c.mu.Unlock()
	}
	return c.mem.Checkpoint(id, ts)
}

// countingTransportForTest forwards sends and counts refusals, signalling
// the first one on busy; if inbox is set, it records the largest queue
// length seen after a send.
type countingTransportForTest struct {
	inner  messaging.Transport
	inbox  *messaging.Inbox
	sends  atomic.Int64
	busys  atomic.Int64
	maxLen atomic.Int64
	busy   chan struct{}
	once   sync.Once
}

func (c *countingTransportForTest) Send(to messaging.Target, msgs []messaging.Message) error {
	c.sends.Add(1)
	err := c.inner.Send(to, msgs)
	if c.inbox != nil {
		for n := int64(c.inbox.Len()); ; {
			old := c.maxLen.Load()
			if n <= old || c.maxLen.CompareAndSwap(old, n) {
				break
			}
		}
	}
	if errors.Is(err, messaging.ErrBusy) {
		c.busys.Add(1)
		c.once.Do(func() { close(c.busy) })
	}
	return err
}

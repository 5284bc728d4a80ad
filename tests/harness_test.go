package tests

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventcollector"
	"github.com/cdcflow/eventservice/pkg/eventservice"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/schemastore"
	"github.com/cdcflow/eventservice/pkg/upstream"
)

// harnessConfig describes a stack built from the packages: a Generator
// workload, the pebble event store, the in-memory schema store, the
// in-process transport (optionally wrapped), the event service and one
// collector whose sink is a checker.
type harnessConfig struct {
	seed            uint64
	tables          int
	rate            int // rows/s over all tables
	duration        time.Duration
	txnsPerCommitTs int
	txnRows         int
	rowBytes        int
	keysPerTable    int
	tick            time.Duration
	// genClock drives the generator's frontier (nil: the real clock).
	genClock clock.Clock
	// ddlEveryTicks plans a DDL every that many ticks (0: none).
	ddlEveryTicks int
	// manualSchema: the test moves the schema frontier itself; otherwise
	// a driver follows the generator's frontier every few milliseconds.
	manualSchema bool
	// onDisk puts the store in a temporary directory instead of memory.
	onDisk    bool
	storeOpts func(*eventstore.Options)
	capacity  int // inbox capacity in messages; default 4096
	// transport wraps the service's transport.
	transport func(messaging.Transport) messaging.Transport
	svcOpts   func(*eventservice.Options)
	heartbeat time.Duration // collector heartbeat; default 50ms
}

// harness is a running stack. Close (registered as a cleanup) stops it in
// dependency order.
type harness struct {
	t      *testing.T
	cfg    harnessConfig
	gen    *upstream.Generator
	start  common.Ts
	end    common.Ts
	plan   ddlPlan
	ddls   *ddlBook
	store  *eventstore.Store
	schema *schemastore.Memory
	inproc *messaging.InProcess
	inbox  *messaging.Inbox
	svc    *eventservice.Service
	svcOpt eventservice.Options
	coll   *eventcollector.Collector
	chk    *checkerForTest
	reg    *prometheus.Registry
	samp   *sampler

	stopSchema chan struct{}
	wg         sync.WaitGroup
	closeOnce  sync.Once

	mu struct {
		sync.Mutex
		live, peakLive int
	}
}

func newHarness(t *testing.T, cfg harnessConfig) *harness {
	t.Helper()
	if cfg.tick == 0 {
		cfg.tick = upstream.DefaultTick
	}
	if cfg.capacity == 0 {
		cfg.capacity = messaging.DefaultCapacity
	}
	if cfg.heartbeat == 0 {
		cfg.heartbeat = 50 * time.Millisecond
	}
	h := &harness{t: t, cfg: cfg, ddls: newDDLBook(), reg: prometheus.NewRegistry(), stopSchema: make(chan struct{})}
	now := time.Now()
	if cfg.genClock != nil {
		now = cfg.genClock.Now()
	}
	h.start, h.end = workloadSpan(now, cfg.tick, cfg.duration)
	var err error
	h.gen, err = upstream.NewGenerator(upstream.GeneratorOptions{Tables: cfg.tables, RowsPerSec: cfg.rate,
		TxnRows: cfg.txnRows, RowBytes: cfg.rowBytes, TxnsPerCommitTs: cfg.txnsPerCommitTs, KeysPerTable: cfg.keysPerTable, Seed: cfg.seed,
		Tick: cfg.tick, StartTs: h.start, EndTs: h.end, Clock: cfg.genClock})
	require.NoError(t, err)
	h.plan = ddlPlan{gen: h.gen, seed: cfg.seed, tables: cfg.tables, everyTicks: int64(cfg.ddlEveryTicks), tickMs: cfg.tick.Milliseconds()}

	sopts := eventstore.Options{Upstream: h.gen, Registerer: h.reg}
	if cfg.onDisk {
		sopts.Dir = t.TempDir()
	}
	if cfg.storeOpts != nil {
		cfg.storeOpts(&sopts)
	}
	h.store, err = eventstore.Open(sopts)
	require.NoError(t, err)
	h.schema, err = schemastore.NewMemory(schemastore.MemoryOptions{InitialResolvedTs: h.start})
	require.NoError(t, err)
	h.inproc, err = messaging.NewInProcess(messaging.InProcessOptions{Capacity: cfg.capacity})
	require.NoError(t, err)
	h.inbox, err = h.inproc.Register("collector")
	require.NoError(t, err)
	var tr messaging.Transport = h.inproc
	if cfg.transport != nil {
		tr = cfg.transport(tr)
	}
	// Short back-off and keepalive periods: faults are injected densely, and
	// recovery from them should take milliseconds, not the production
	// seconds. Scenarios that congest thousands of dispatchers restore the
	// production back-off (svcOpts).
	h.svcOpt = eventservice.Options{Store: h.store, Schema: h.schema, Transport: tr, Registerer: h.reg,
		BackoffBase: time.Millisecond, BackoffMax: 20 * time.Millisecond, SignalInterval: 100 * time.Millisecond}
	if cfg.svcOpts != nil {
		cfg.svcOpts(&h.svcOpt)
	}
	h.svc, err = eventservice.New(h.svcOpt)
	require.NoError(t, err)
	h.svcOpt = h.svcOpt.EnsureDefaults()
	h.chk = newCheckerForTest(&genOracle{gen: h.gen, ddls: h.ddls, schema: h.schema})
	h.coll, err = eventcollector.New(eventcollector.Options{Service: h.svc, Inbox: h.inbox, Sink: h.chk,
		HeartbeatInterval: cfg.heartbeat, Registerer: h.reg})
	require.NoError(t, err)
	t.Cleanup(h.close)

	require.NoError(t, h.store.Start())
	require.NoError(t, h.svc.Start())
	require.NoError(t, h.coll.Start())
	h.samp = startSampler(h)
	return h
}

// id returns the ID of instance gen of dispatcher n.
func id(gen, n uint64) common.DispatcherID { return common.DispatcherID{Hi: gen, Lo: n} }

// add adds dispatcher id on table from startTs (checker first, so the
// first sink call is expected).
func (h *harness) add(did common.DispatcherID, table int64, startTs common.Ts) error {
	h.chk.bind(did, table, startTs)
	if err := h.coll.AddDispatcher(context.Background(), did, common.TableSpan(table), startTs); err != nil {
		h.chk.unbind(did)
		return err
	}
	h.mu.Lock()
	h.mu.live++
	h.mu.peakLive = max(h.mu.peakLive, h.mu.live)
	h.mu.Unlock()
	return nil
}

// remove removes dispatcher id from the collector (and the service).
func (h *harness) remove(did common.DispatcherID) error {
	err := h.coll.RemoveDispatcher(context.Background(), did)
	h.chk.unbind(did)
	h.mu.Lock()
	h.mu.live--
	h.mu.Unlock()
	return err
}

// run starts the upstream and, unless manualSchema, the schema driver.
func (h *harness) run() {
	require.NoError(h.t, h.gen.Start())
	if !h.cfg.manualSchema {
		h.wg.Go(h.driveSchema)
	}
}

// driveSchema keeps the schema frontier a few milliseconds behind the
// upstream's, adding the planned DDLs on the way. Trailing the upstream
// makes dispatchers meet the schema frontier, so the schema-blocked path
// runs in every scenario.
func (h *harness) driveSchema() {
	t := time.NewTicker(5 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-h.stopSchema:
			return
		}
		if err := advanceSchema(h.schema, h.plan, h.ddls, h.gen.ResolvedTs()); err != nil {
			h.t.Errorf("schema driver: %v", err)
			return
		}
	}
}

// waitDelivered waits until every live dispatcher's checkpoint reached the
// workload's end, failing with the laggards' state after timeout.
func (h *harness) waitDelivered(timeout time.Duration) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := h.chk.waitAll(ctx, h.end); err != nil {
		for _, b := range h.chk.behind(h.end, 5) {
			h.t.Log(b.state)
			h.logState(b.id)
		}
		h.t.Fatalf("delivery did not reach the upstream's final resolved-ts %v within %v (lost wakeup?): %v", h.end, timeout, err)
	}
}

// logState logs what the service, the store and the collector hold for
// dispatcher id, so that a failure names where its progress stopped.
func (h *harness) logState(id common.DispatcherID) {
	h.t.Helper()
	svc, svcErr := h.svc.Inspect(id)
	st, stErr := h.store.Dispatcher(id)
	coll, collErr := h.coll.Dispatcher(id)
	h.t.Logf("  service %+v (%v)\n  store %+v (%v)\n  collector %+v (%v)", svc, svcErr, st, stErr, coll, collErr)
}

// requireClean fails if the checker saw any broken guarantee.
func (h *harness) requireClean() {
	h.t.Helper()
	if n, first := h.chk.violations(); n > 0 {
		for _, v := range first {
			h.t.Log(v)
		}
		h.t.Fatalf("%d guarantee violations", n)
	}
}

// peakLive returns the most dispatchers that were registered at once.
func (h *harness) peakLive() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mu.peakLive
}

// close stops everything in dependency order: schema driver and upstream,
// collector, service (which unregisters from the store), store, transport.
func (h *harness) close() {
	h.closeOnce.Do(func() {
		close(h.stopSchema)
		h.wg.Wait()
		h.gen.Close()
		h.samp.stop()
		require.NoError(h.t, h.coll.Close())
		require.NoError(h.t, h.svc.Close())
		require.NoError(h.t, h.store.Close())
		h.inproc.Close()
	})
}

package tests

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventservice"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

// TestModel is a seeded, randomised test of the whole scheduler. Each seed
// draws a sequence of steps: advance the upstream (a generator on a fake
// clock, so its frontier moves only when a step says so) or the schema
// frontier (to any timestamp, often the commit-ts of a row), add a DDL at a
// future commit-ts (often one shared with rows), reset a dispatcher through
// the service (from a start-ts at or below the collector's checkpoint),
// lose the next message of a dispatcher, start a transport outage (busy or
// failed) lasting a few steps, fail the sink once, move a dispatcher
// (remove it and add the same ID again from its checkpoint, a new
// registration, while messages of the old one may still be queued), remove
// a dispatcher, add one (a new ID or a removed one again) from a past or
// present start-ts. The service runs with tiny scan and
// batch limits, one scan worker and a scan channel of one, so scans are
// interrupted, transactions split and queues contended.
//
// The model is the expected delivery per dispatcher: its start-ts, the
// upstream's rows and the recorded DDLs, and its expected checkpoint
// max(start, min(upstream frontier, schema frontier)). After every step the
// checker must have seen no violation and no checkpoint above the model;
// unless an outage is on, the test waits until every live dispatcher is at
// exactly its expected checkpoint (the checker verified every row and DDL
// up to it). A seed replays from CDCFLOW_MODEL_SEED; its failure prints the
// seed and the last steps.
func TestModel(t *testing.T) {
	for _, seed := range modelSeeds(t) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) { runModel(t, seed) })
	}
}

// modelSeeds returns CDCFLOW_MODEL_SEED alone if set, else
// CDCFLOW_MODEL_SEEDS seeds (default 5) from CDCFLOW_MODEL_SEED_BASE
// (default 1).
func modelSeeds(t *testing.T) []uint64 {
	if v := envUint(t, envModelSeed, 0); v != 0 {
		return []uint64{v}
	}
	n, base := envUint(t, envModelSeeds, 5), envUint(t, envModelBase, 1)
	out := make([]uint64, n)
	for i := range out {
		out[i] = base + uint64(i)
	}
	return out
}

type modelDisp struct {
	id    common.DispatcherID
	table int64
	start common.Ts
	live  bool
}

// model drives one seed.
type model struct {
	t      *testing.T
	rng    *rand.Rand
	h      *harness
	fake   *clock.Fake
	tr     *switchTransportForTest
	ds     []*modelDisp
	nextID uint64
	// outage counts the steps left with the transport down.
	outage int
	steps  []string
	counts map[string]int
}

const (
	modelTables = 6
	modelTick   = 10 * time.Millisecond
)

func runModel(t *testing.T, seed uint64) {
	steps := 150 * scale(t)
	s := &scenario{name: fmt.Sprintf("model seed %d", seed)}
	report(t, s)
	m := &model{t: t, rng: rand.New(rand.NewPCG(seed, 0x6d6f64656c)), fake: clock.NewFake(time.UnixMilli(1_900_000_000_000)),
		counts: map[string]int{}}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("FAILED model seed %d after steps:\n  %s", seed, strings.Join(m.steps[max(0, len(m.steps)-30):], "\n  "))
			t.Logf("replay: %s=%d go test -race -run '^TestModel$' ./tests/", envModelSeed, seed)
		}
	})
	m.h = newHarness(t, harnessConfig{
		seed: seed, tables: modelTables, rate: 4800, txnRows: 8, rowBytes: 64, txnsPerCommitTs: 3, keysPerTable: 64,
		tick: modelTick, duration: time.Duration(steps+20) * modelTick, genClock: m.fake, manualSchema: true,
		capacity: 64, heartbeat: 10 * time.Millisecond,
		storeOpts: func(o *eventstore.Options) {
			o.IdleTTL, o.MaintenanceInterval, o.GCMinSpan, o.GCMaxDelay = 10*time.Millisecond, 2*time.Millisecond, time.Millisecond, 2*time.Millisecond
		},
		transport: func(inner messaging.Transport) messaging.Transport {
			m.tr = newSwitchTransportForTest(inner)
			return m.tr
		},
		svcOpts: func(o *eventservice.Options) {
			o.ScanWorkers, o.ScanQueueSize, o.ScanLimitRows, o.ScanLimitBytes, o.LargeTxnSplitBytes = 1, 1, 7, 400, 400
			o.BatchRows, o.MaxMessagesPerTask = 3, 8
			o.SignalInterval, o.BackoffBase, o.BackoffMax = 20*time.Millisecond, time.Millisecond, 5*time.Millisecond
		},
	})
	for range 8 {
		m.addDispatcher(m.h.start)
	}
	m.h.run()
	m.check()
	for i := range steps {
		m.step(i)
		m.check()
	}
	// Heal and finish: everything up to the workload's end.
	m.tr.setOutage(nil)
	m.outage = 0
	m.fake.Advance(time.Duration(m.h.end.PhysicalMs()-m.frontier().PhysicalMs()+1) * time.Millisecond)
	require.NoError(t, advanceSchema(m.h.schema, m.h.plan, m.h.ddls, m.h.end))
	m.logStep("final: upstream and schema to the end %v", m.h.end)
	m.check()
	live := 0
	for _, d := range m.ds {
		if d.live {
			live++
			require.Equal(t, m.h.end, m.h.chk.checkpoint(d.id))
		}
	}
	refused, dropped := m.tr.counts()
	cs := m.h.coll.Stats()
	s.dispatchers, s.rows, s.resets = int(m.nextID), int64(m.h.chk.stats().RowsApplied), cs.TotalResets()
	s.faults = fmtFaults("%d steps: %d lost, %d refused, %d sink errors", steps, dropped, refused, m.counts["sink error"])
	t.Logf("seed %d: %d steps %v; %d sends refused, %d messages lost; collector resets %v; %d live dispatchers at the end",
		seed, steps, m.counts, refused, dropped, cs.Resets, live)
	m.h.requireBounded()
}

// frontier is the generator's frontier the fake clock implies.
func (m *model) frontier() common.Ts {
	tickMs := modelTick.Milliseconds()
	f := common.ComposeTs(m.fake.Now().UnixMilli()/tickMs*tickMs, 0) - 1
	return min(max(f, m.h.start), m.h.end)
}

// expected is d's checkpoint once the system is quiescent.
func (m *model) expected(d *modelDisp) common.Ts {
	return max(d.start, min(m.frontier(), m.h.schema.ResolvedTs()))
}

func (m *model) logStep(format string, args ...any) {
	m.steps = append(m.steps, fmt.Sprintf(format, args...))
}

func (m *model) live() []*modelDisp {
	var out []*modelDisp
	for _, d := range m.ds {
		if d.live {
			out = append(out, d)
		}
	}
	return out
}

// move moves d away and back: it removes d and adds the same ID again from
// its checkpoint, a new registration, while messages of the old one may
// still be queued. Half the time a send of d is in flight, held in the
// transport, when the removal starts, and released while Remove runs
// (before or after it reaches its fence): Remove must wait for it, and its
// messages must not reach the new registration.
func (m *model) move(i int, d *modelDisp) {
	h := m.h
	inFlight := m.outage == 0 && m.frontier() < h.end && m.rng.IntN(2) == 0
	if inFlight {
		// Quiescent (check ran after the last step), so nothing of d is in
		// flight; new progress makes d send, and that send is held.
		held, release := m.tr.holdNext(d.id)
		defer release()
		m.fake.Advance(modelTick)
		require.NoError(m.t, advanceSchema(h.schema, h.plan, h.ddls, max(h.schema.ResolvedTs(), m.frontier())))
		select {
		case <-held:
		case <-time.After(scaled(m.t, 30*time.Second)): // a hang guard, not synchronisation
			m.t.Fatalf("no send of %v after new progress", d.id)
		}
		removed := make(chan error, 1)
		go func() { removed <- h.remove(d.id) }()
		release()
		require.NoError(m.t, <-removed)
	} else {
		require.NoError(m.t, h.remove(d.id))
	}
	start := max(d.start, h.chk.checkpoint(d.id))
	require.NoError(m.t, h.add(d.id, d.table, start))
	d.start = start
	m.counts["move"]++
	m.logStep("%d: move %v (a send in flight: %v): removed and added again from its checkpoint %v", i, d.id, inFlight, start)
}

// removed returns the dispatchers removed and not added again.
func (m *model) removed() []*modelDisp {
	var out []*modelDisp
	for _, d := range m.ds {
		if !d.live {
			out = append(out, d)
		}
	}
	return out
}

func (m *model) pick() *modelDisp {
	l := m.live()
	return l[m.rng.IntN(len(l))]
}

// between returns a random ts in [lo, hi].
func (m *model) between(lo, hi common.Ts) common.Ts {
	if hi <= lo {
		return lo
	}
	return lo + common.Ts(m.rng.Uint64N(uint64(hi-lo)+1))
}

// rowTsIn returns the commit-ts of a random row in (lo, hi], or a random
// ts in the range if no table has one.
func (m *model) rowTsIn(table int64, lo, hi common.Ts) common.Ts {
	if rows := m.h.gen.Rows(table, lo, hi); len(rows) > 0 {
		return rows[m.rng.IntN(len(rows))].CommitTs
	}
	return m.between(lo+1, hi)
}

func (m *model) addDispatcher(start common.Ts) {
	m.nextID++
	d := &modelDisp{id: id(7, m.nextID), table: int64(m.rng.IntN(modelTables) + 1), start: start, live: true}
	m.ds = append(m.ds, d)
	require.NoError(m.t, m.h.add(d.id, d.table, d.start))
	m.logStep("add %v table %d from %v", d.id, d.table, start)
}

// step draws and performs one step.
func (m *model) step(i int) {
	h := m.h
	span := common.Ts(modelTick.Milliseconds() << common.LogicalBits)
	kind := m.rng.IntN(100)
	switch {
	case kind < 25:
		k := 1 + m.rng.IntN(4)
		m.fake.Advance(time.Duration(k) * modelTick)
		m.counts["upstream"]++
		m.logStep("%d: upstream +%d ticks -> %v", i, k, m.frontier())
	case kind < 45:
		s := h.schema.ResolvedTs()
		to := s + 1 + common.Ts(m.rng.Uint64N(uint64(3*span)))
		if m.rng.IntN(2) == 0 {
			to = m.rowTsIn(int64(m.rng.IntN(modelTables)+1), s, s+3*span)
		}
		require.NoError(m.t, advanceSchema(h.schema, h.plan, h.ddls, to))
		m.counts["schema"]++
		m.logStep("%d: schema -> %v", i, to)
	case kind < 55:
		s := h.schema.ResolvedTs()
		table := int64(m.rng.IntN(modelTables) + 1)
		ts := m.rowTsIn(table, s, min(s+5*span, h.end))
		d := schemastore.DDL{TableID: table, CommitTs: ts, Query: fmt.Sprintf("ALTER TABLE t%d /* step %d */", table, i)}
		if ts > s && ts <= h.end && h.schema.AddDDL(d) == nil {
			h.ddls.add(d)
			m.counts["ddl"]++
			m.logStep("%d: DDL table %d at %v", i, table, ts)
		}
	case kind < 65:
		d := m.pick()
		snap, err := h.svc.Inspect(d.id)
		require.NoError(m.t, err)
		cs, err := h.coll.Dispatcher(d.id)
		require.NoError(m.t, err)
		start := m.between(d.start, cs.Checkpoint)
		err = h.svc.Reset(context.Background(), messaging.ResetRequest{Dispatcher: d.id, Registration: snap.Registration, Epoch: snap.Epoch + 1, StartTs: start})
		if err != nil && !errors.Is(err, messaging.ErrStaleEpoch) {
			require.NoError(m.t, err)
		}
		m.counts["reset"]++
		m.logStep("%d: reset %v to epoch %d from %v (collector checkpoint %v): %v", i, d.id, snap.Epoch+1, start, cs.Checkpoint, err)
	case kind < 73:
		d := m.pick()
		m.tr.dropNext(d.id)
		m.counts["drop"]++
		m.logStep("%d: lose the next message of %v", i, d.id)
	case kind < 78:
		if m.outage == 0 {
			m.outage = 1 + m.rng.IntN(4)
			err := messaging.ErrBusy
			if m.rng.IntN(2) == 0 {
				err = fmt.Errorf("%w: injected outage", messaging.ErrSendFailed)
			}
			refused, _ := m.tr.counts()
			m.tr.setOutage(err)
			// Give every live dispatcher progress to send, and see the
			// service try: the outage is then really in the way.
			m.fake.Advance(modelTick)
			require.NoError(m.t, advanceSchema(h.schema, h.plan, h.ddls, max(h.schema.ResolvedTs(), m.frontier())))
			m.counts["outage"]++
			m.logStep("%d: transport outage (%v) for %d steps; upstream and schema -> %v", i, err, m.outage, m.frontier())
			// See a send refused by the outage.
			m.tr.waitRefused(m.t, scaled(m.t, 30*time.Second), refused)
			return // the outage ends after later steps
		}
	case kind < 85:
		d := m.pick()
		h.chk.failNextRows(d.id)
		m.counts["sink error"]++
		m.logStep("%d: fail the next rows of %v at the sink", i, d.id)
	case kind < 88:
		m.move(i, m.pick())
	case kind < 90:
		if len(m.live()) > 2 {
			d := m.pick()
			require.NoError(m.t, h.remove(d.id))
			d.live = false
			m.counts["remove"]++
			m.logStep("%d: remove %v", i, d.id)
		}
	default:
		if len(m.live()) < 12 {
			var start common.Ts
			switch m.rng.IntN(3) {
			case 0:
				start = h.start
			case 1:
				start = min(m.frontier(), h.schema.ResolvedTs())
			default:
				start = m.between(h.start, min(m.frontier(), h.schema.ResolvedTs()))
			}
			if dead := m.removed(); len(dead) > 0 && m.rng.IntN(2) == 0 {
				d := dead[m.rng.IntN(len(dead))] // an ID removed earlier comes back
				d.start, d.live = start, true
				require.NoError(m.t, h.add(d.id, d.table, start))
				m.counts["re-add"]++
				m.logStep("%d: re-add %v table %d from %v", i, d.id, d.table, start)
				break
			}
			m.addDispatcher(start)
			m.counts["add"]++
		}
	}
	if m.outage > 0 {
		if m.outage--; m.outage == 0 {
			m.tr.setOutage(nil)
			m.logStep("%d: outage over", i)
		}
	}
}

// check compares the system with the model: no violation, no checkpoint
// above the model, and, with the transport up, every live dispatcher at
// exactly its expected checkpoint once quiescent.
func (m *model) check() {
	m.t.Helper()
	m.h.requireClean()
	for _, d := range m.live() {
		require.LessOrEqual(m.t, m.h.chk.checkpoint(d.id), m.expected(d), "%v ahead of the model", d.id)
	}
	if m.outage > 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), scaled(m.t, 30*time.Second))
	defer cancel()
	reached := func() bool {
		for _, d := range m.live() {
			if m.h.chk.checkpoint(d.id) != m.expected(d) {
				return false
			}
		}
		return true
	}
	if err := m.h.chk.wait(ctx, reached); err != nil {
		for _, d := range m.live() {
			snap, _ := m.h.svc.Inspect(d.id)
			cs, _ := m.h.coll.Dispatcher(d.id)
			m.t.Logf("%v table %d start %v: checkpoint %v, expected %v; service %+v; collector %+v",
				d.id, d.table, d.start, m.h.chk.checkpoint(d.id), m.expected(d), snap, cs)
		}
		m.t.Fatalf("not quiescent at the model's expectation (lost wakeup?): %v", err)
	}
	m.h.requireClean()
}

package upstream

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
)

// TestGeneratorWakesOnTheWallClocksTickBoundary: started 3 ms into a tick,
// the driver's next pass is due at the boundary 7 ms later, when the
// frontier can move, not a whole tick after its own start (a ticker of its
// own phase published every resolved-ts up to a tick late).
func TestGeneratorWakesOnTheWallClocksTickBoundary(t *testing.T) {
	clk := clock.NewFake(t0.Add(time.Second + 3*time.Millisecond))
	g := newTestGenerator(t, feedOptions(clk))
	sink := newRecordingSinkForTest()
	_, err := g.Subscribe(common.TableSpan(1), common.TsFromTime(t0), sink)
	require.NoError(t, err)
	require.NoError(t, g.Start())
	sink.waitResolved(t, frontierAt(clk.Now(), testTick))

	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	require.NoError(t, clk.WaitWaiters(ctx, 1))
	due, ok := clk.NextDue()
	require.True(t, ok)
	require.Equal(t, 7*time.Millisecond, due, "the next pass waits for the tick boundary")

	clk.Advance(due)
	f := frontierAt(clk.Now(), testTick)
	sink.waitResolved(t, f)
	require.Equal(t, f, g.ResolvedTs())
	require.NoError(t, clk.WaitWaiters(ctx, 1))
	due, ok = clk.NextDue()
	require.True(t, ok)
	require.Equal(t, testTick, due, "on a boundary, the next is a whole tick away")
}

// TestOnFrontierRunsBeforeAnyFeedReachesIt: every frontier is announced,
// in increasing order, before any subscription receives a row or a
// resolved-ts above it, so what an embedder keeps in step there (cdcserver's
// schema store) is never behind a table's resolved-ts.
func TestOnFrontierRunsBeforeAnyFeedReachesIt(t *testing.T) {
	clk := clock.NewFake(t0.Add(time.Second))
	var announced atomic.Uint64
	var mu sync.Mutex
	var frontiers []common.Ts
	o := feedOptions(clk)
	o.Tables = 4
	o.OnFrontier = func(f common.Ts) {
		mu.Lock()
		defer mu.Unlock()
		frontiers = append(frontiers, f)
		announced.Store(uint64(f))
	}
	g := newTestGenerator(t, o)
	var ahead atomic.Pointer[string]
	sinks := make([]*recordingSinkForTest, 3)
	for i := range sinks {
		sinks[i] = newRecordingSinkForTest()
		sinks[i].pushHook = func(_ context.Context, b eventstore.Batch) error {
			a := common.Ts(announced.Load())
			if b.ResolvedTs > a {
				msg := fmt.Sprintf("resolved-ts %v pushed before it was announced (last %v)", b.ResolvedTs, a)
				ahead.CompareAndSwap(nil, &msg)
			}
			for _, r := range b.Rows {
				if r.CommitTs > a {
					msg := fmt.Sprintf("row at %v pushed before its frontier was announced (last %v)", r.CommitTs, a)
					ahead.CompareAndSwap(nil, &msg)
				}
			}
			return nil
		}
		_, err := g.Subscribe(common.TableSpan(int64(i+1)), common.TsFromTime(t0), sinks[i])
		require.NoError(t, err)
	}
	require.NoError(t, g.Start())
	for step := range 5 {
		if step == 2 { // a subscription added while running catches up from StartTs
			sinks = append(sinks, newRecordingSinkForTest())
			sinks[3].pushHook = sinks[0].pushHook
			_, err := g.Subscribe(common.TableSpan(4), common.TsFromTime(t0), sinks[3])
			require.NoError(t, err)
		}
		clk.Advance(time.Duration(step+1) * testTick)
		f := frontierAt(clk.Now(), testTick)
		for _, s := range sinks {
			s.waitResolved(t, f)
		}
	}
	if msg := ahead.Load(); msg != nil {
		t.Fatal(*msg)
	}
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, frontiers)
	require.Greater(t, frontiers[0], common.TsFromTime(t0), "the first call is a move above StartTs")
	require.IsIncreasing(t, frontiers)
	require.Equal(t, g.ResolvedTs(), frontiers[len(frontiers)-1])
}

// TestBoundaryCrossedDuringAPassIsNotLost: when a tick boundary passes
// while a pass is feeding, the driver's next wait is for the boundary after
// the time the pass read, which is already behind it: it goes again at
// once and publishes the new frontier, with no further clock movement
// (waiting from the pass's end skipped that boundary until the next one).
func TestBoundaryCrossedDuringAPassIsNotLost(t *testing.T) {
	clk := clock.NewFake(t0.Add(time.Second + 5*time.Millisecond))
	g := newTestGenerator(t, feedOptions(clk))
	passes := make(chan struct{}, 16)
	g.knobs.pass = func(p passInfo) {
		if !p.more {
			passes <- struct{}{}
		}
	}
	sink := newRecordingSinkForTest()
	var armed, crossed atomic.Bool
	sink.pushHook = func(context.Context, eventstore.Batch) error {
		if armed.Load() && crossed.CompareAndSwap(false, true) {
			clk.Advance(testTick) // the next boundary passes in the middle of this pass
		}
		return nil
	}
	_, err := g.Subscribe(common.TableSpan(1), common.TsFromTime(t0), sink)
	require.NoError(t, err)
	require.NoError(t, g.Start())
	// The first pass, then the one the Subscribe's kick asks for: the
	// driver now waits on its timer alone.
	for range 2 {
		select {
		case <-passes:
		case <-time.After(waitTimeout):
			t.Fatal("no pass")
		}
	}
	after := frontierAt(clk.Now().Add(5*time.Millisecond+testTick), testTick) // once both boundaries passed
	armed.Store(true)
	clk.Advance(5 * time.Millisecond) // to the boundary: a pass starts, and another boundary passes during it
	sink.waitResolved(t, after)
	require.True(t, crossed.Load())
	require.Equal(t, after, g.ResolvedTs())
}

// TestBoundaryPassedWhileArmingIsNotLost: the clock moves to the next tick
// boundary after the driver computed its wait and before it armed the
// timer with it. The timer is then armed a tick past the boundary, so the
// driver must see on its own that the boundary passed and go at once; it
// publishes the new frontier with no further clock movement (this is the
// interleaving TestGeneratorResolvedInterval once lost in CI: without the
// second reading of the clock the driver waited for a boundary the fake
// never reached).
func TestBoundaryPassedWhileArmingIsNotLost(t *testing.T) {
	clk := clock.NewFake(t0.Add(time.Second))
	g := newTestGenerator(t, feedOptions(clk))
	w := watchPasses(g)
	var arm atomic.Bool
	g.knobs.arming = func() {
		if arm.CompareAndSwap(true, false) {
			clk.Advance(testTick) // in the gap: no timer is armed, nothing fires
		}
	}
	sink := newRecordingSinkForTest()
	_, err := g.Subscribe(common.TableSpan(1), common.TsFromTime(t0), sink)
	require.NoError(t, err)
	require.NoError(t, g.Start())
	f := frontierAt(clk.Now(), testTick)
	w.waitIdle(t, 0, f)
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	require.NoError(t, clk.WaitWaiters(ctx, 1)) // the driver waits on its timer

	n := w.passes()
	arm.Store(true)
	clk.Advance(testTick) // a pass, and the next boundary passes while it arms
	next := frontierAt(clk.Now().Add(testTick), testTick)
	w.waitIdle(t, n, next)
	sink.waitResolved(t, next)
	require.False(t, arm.Load(), "the hook moved the clock")
	require.Equal(t, next, g.ResolvedTs())
}

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
	require.IsIncreasing(t, frontiers)
	require.Equal(t, g.ResolvedTs(), frontiers[len(frontiers)-1])
}

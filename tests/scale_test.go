package tests

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventcollector"
	"github.com/cdcflow/eventservice/pkg/eventservice"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

// sparseUpstreamForTest is an eventstore.Upstream that keeps one sink per
// table and pushes to it directly: an O(1) push whatever the number of
// subscriptions (the upstream is not what this test is about).
type sparseUpstreamForTest struct {
	mu    sync.Mutex
	sinks map[int64]eventstore.Sink
}

type sparseSubForTest struct{}

func (sparseSubForTest) Close() {}

func (u *sparseUpstreamForTest) Subscribe(span common.Span, _ common.Ts, sink eventstore.Sink) (eventstore.Subscription, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.sinks[span.TableID] = sink
	return sparseSubForTest{}, nil
}

func (u *sparseUpstreamForTest) push(t *testing.T, table int64, b eventstore.Batch) {
	u.mu.Lock()
	sink := u.sinks[table]
	u.mu.Unlock()
	require.NoError(t, sink.Push(context.Background(), b))
}

// scaleSinkForTest counts the dispatchers whose checkpoint reached the
// current round's target, and checks each dispatcher's rows: in order,
// each once, none at or below its checkpoint.
type scaleSinkForTest struct {
	mu     sync.Mutex
	target common.Ts
	left   int
	done   chan struct{}
	ckpt   map[common.DispatcherID]common.Ts
	rows   map[common.DispatcherID][]common.Row
	bad    []string
	// begins counts handshakes; allBegun closes at the wantBegins-th.
	begins     atomic.Int64
	wantBegins int64
	allBegun   chan struct{}
}

func (s *scaleSinkForTest) expect(target common.Ts, n int) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.target, s.left, s.done = target, n, make(chan struct{})
	for _, c := range s.ckpt {
		if c >= target {
			s.left--
		}
	}
	if s.left == 0 {
		close(s.done)
	}
	return s.done
}

func (s *scaleSinkForTest) BeginEpoch(common.DispatcherID, uint64, common.Ts) error {
	if s.begins.Add(1) == s.wantBegins {
		close(s.allBegun)
	}
	return nil
}

func (s *scaleSinkForTest) ApplyRows(id common.DispatcherID, rows []common.Row) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range rows {
		if r.CommitTs <= s.ckpt[id] {
			s.bad = append(s.bad, fmt.Sprintf("%v: row at %v, checkpoint %v", id, r.CommitTs, s.ckpt[id]))
		}
	}
	s.rows[id] = append(s.rows[id], rows...)
	return nil
}

func (s *scaleSinkForTest) ApplyDDL(common.DispatcherID, *messaging.DDL) error { return nil }

func (s *scaleSinkForTest) Checkpoint(id common.DispatcherID, ts common.Ts) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	prev := s.ckpt[id]
	s.ckpt[id] = ts
	if prev < s.target && ts >= s.target && s.left > 0 {
		if s.left--; s.left == 0 {
			close(s.done)
		}
	}
	return nil
}

// TestScale registers 200k dispatchers (one table each) with the real
// store, service, in-process transport and one collector, then drives
// three rounds of resolved-ts advances to every table, with rows for one
// table in a hundred: every dispatcher must reach every round's resolved-ts
// with no further notification (no lost wakeup at scale), every row must
// arrive once and in order, and the heap held per idle dispatcher (the
// whole stack: store, service, collector and this sink) must stay within
// 2 KiB, twice the service and store's 1 KiB goal (BenchmarkIdleFootprint
// measures those alone).
func TestScale(t *testing.T) {
	const n = 200_000
	s := &scenario{name: "scale", dispatchers: n, faults: "none"}
	report(t, s)
	// Registered first, so it runs last, once the stack is closed: collect
	// its few hundred MB now, so that the next test (which times the
	// notify callback against the scheduler's delays) does not pay for
	// them in GC assists.
	t.Cleanup(debug.FreeOSMemory)
	up := &sparseUpstreamForTest{sinks: make(map[int64]eventstore.Sink, n)}
	ts := func(round int) common.Ts { return common.ComposeTs(1_700_000_000_000+int64(round)*1000, 0) }

	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)

	store, err := eventstore.Open(eventstore.Options{Upstream: up})
	require.NoError(t, err)
	require.NoError(t, store.Start())
	schema, err := schemastore.NewMemory(schemastore.MemoryOptions{InitialResolvedTs: ts(0)})
	require.NoError(t, err)
	inproc, err := messaging.NewInProcess(messaging.InProcessOptions{Capacity: 1 << 16})
	require.NoError(t, err)
	inbox, err := inproc.Register("scale")
	require.NoError(t, err)
	svc, err := eventservice.New(eventservice.Options{Store: store, Schema: schema, Transport: inproc})
	require.NoError(t, err)
	require.NoError(t, svc.Start())
	sink := &scaleSinkForTest{ckpt: make(map[common.DispatcherID]common.Ts, n), rows: make(map[common.DispatcherID][]common.Row, n/100),
		wantBegins: n, allBegun: make(chan struct{})}
	coll, err := eventcollector.New(eventcollector.Options{Service: svc, Inbox: inbox, Sink: sink})
	require.NoError(t, err)
	require.NoError(t, coll.Start())
	t.Cleanup(func() {
		require.NoError(t, coll.Close())
		require.NoError(t, svc.Close())
		require.NoError(t, store.Close())
		inproc.Close()
	})

	start := time.Now()
	specs := make([]eventcollector.DispatcherSpec, n)
	for i := range n {
		specs[i] = eventcollector.DispatcherSpec{ID: common.DispatcherIDFromUint64(uint64(i + 1)), Span: common.TableSpan(int64(i + 1)), StartTs: ts(0)}
	}
	for i, err := range coll.AddDispatchers(context.Background(), specs) { // in batches of messaging.MaxRegisterBatch
		require.NoError(t, err, "dispatcher %d", i+1)
	}
	t.Logf("registered %d dispatchers in %v", n, time.Since(start))
	ctx, cancel := context.WithTimeout(context.Background(), scaled(t, 10*time.Minute))
	defer cancel()
	select { // every handshake applied: idle
	case <-sink.allBegun:
	case <-ctx.Done():
		t.Fatalf("only %d of %d handshakes arrived", sink.begins.Load(), n)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	perDispatcher := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("idle heap per dispatcher (store, service, collector, sink): %.0f B", perDispatcher)
	require.LessOrEqual(t, perDispatcher, 2048.0, "footprint per idle dispatcher")

	var rows int64
	for round := 1; round <= 3; round++ {
		target := ts(round)
		require.NoError(t, schema.AdvanceResolvedTs(target))
		done := sink.expect(target, n)
		start := time.Now()
		for i := range n {
			table := int64(i + 1)
			b := eventstore.Batch{ResolvedTs: target}
			if table%100 == 0 {
				commit := target - 1
				b.Rows = []common.Row{{Op: common.OpPut, Key: []byte(fmt.Sprintf("k%d", round)), Value: []byte("v"),
					StartTs: commit - 1, CommitTs: commit}}
				rows++
			}
			up.push(t, table, b)
		}
		select {
		case <-done:
		case <-ctx.Done():
			sink.mu.Lock()
			left := sink.left
			sink.mu.Unlock()
			t.Fatalf("round %d: %d dispatchers did not reach %v (lost wakeup?)", round, left, target)
		}
		t.Logf("round %d: %d dispatchers advanced in %v", round, n, time.Since(start))
	}
	// The advances travelled batched: far fewer resolved-ts messages than
	// advances.
	st := coll.Stats()
	batches, entries := st.Messages[messaging.KindResolvedBatch-1], st.Messages[messaging.KindResolved-1]
	t.Logf("%d resolved-ts in %d batches", entries, batches)
	require.Positive(t, batches)
	require.Greater(t, entries, 10*batches, "resolved-ts arrive in batches")
	sink.mu.Lock()
	defer sink.mu.Unlock()
	require.Empty(t, sink.bad)
	var got int64
	for id, rs := range sink.rows {
		table := int64(id.Lo)
		require.Zero(t, table%100, "rows only for the tables that had them")
		require.Len(t, rs, 3, "%v: one row per round, each once", id)
		for r := range rs {
			require.Equal(t, ts(r+1)-1, rs[r].CommitTs, "%v: in order", id)
		}
		got += int64(len(rs))
	}
	require.Equal(t, rows, got)
	s.rows = got
}

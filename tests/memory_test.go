package tests

import (
	"math"
	"runtime"
	"runtime/metrics"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/eventservice"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// TestBoundedMemoryUnderCongestion refuses every send for as long as the
// upstream takes to write a window of rows into the store, then lets the
// transport recover. While congested, the store keeps absorbing rows, but
// nothing may buffer them on the way to the refused transport (the service
// re-reads from the store): the live Go heap outside the storage (pebble,
// and the generator's rows on their way into it) must grow by much less
// than the bytes written, where any per-row buffering in the service, the
// transport or the collector would grow it by at least as much. After the
// congestion every dispatcher must catch up with exactly the upstream's
// rows.
func TestBoundedMemoryUnderCongestion(t *testing.T) {
	dispatchers := 200 * scale(t)
	s := &scenario{name: "bounded memory (congested)", dispatchers: dispatchers}
	report(t, s)
	var tr *switchTransportForTest
	h := newHarness(t, harnessConfig{
		seed:      scenarioSeed(t, 17),
		tables:    dispatchers,
		rate:      20000,
		rowBytes:  200,
		duration:  scaled(t, 8*time.Second),
		onDisk:    true,
		transport: func(inner messaging.Transport) messaging.Transport { tr = newSwitchTransportForTest(inner); return tr },
		svcOpts: func(o *eventservice.Options) {
			o.BackoffBase, o.BackoffMax = eventservice.DefaultBackoffBase, eventservice.DefaultBackoffMax
		},
	})
	tables := make([]int64, dispatchers)
	for i := range tables {
		tables[i] = int64(i + 1)
		require.NoError(t, h.add(id(1, uint64(i+1)), tables[i], h.start))
	}
	h.run()
	// Rows are applied before the checkpoint that covers them, which wakes the wait.
	h.chk.waitFor(t, time.Minute, "data flowing to the collector", func() bool { return h.chk.stats().RowsApplied > 1000 })
	tr.setOutage(messaging.ErrBusy)
	testwait.Within(t, time.Minute, "dispatchers backing off", func() bool {
		refused, _ := tr.counts()
		return refused > dispatchers && h.svc.Stats().BackingOff > 0
	})
	// What was accepted before the congestion is drained first, so the
	// baseline holds no message in flight.
	testwait.Within(t, time.Minute, "the inbox drained", func() bool { return h.inbox.Len() == 0 })

	const window = 12 << 20 // bytes the store absorbs while measured
	t0 := time.Now()
	written0 := storeBytes(h.reg)
	heap0 := steadyHeapOutsideStorage()
	testwait.Within(t, 2*time.Minute, "the store absorbing rows during the congestion", func() bool {
		return storeBytes(h.reg) >= written0+window
	})
	written1 := storeBytes(h.reg)
	heap1 := steadyHeapOutsideStorage()
	growth := heap1 - heap0
	t.Logf("congested for %v: the store wrote %.1f MiB; live heap outside the storage %.1f -> %.1f MiB (%+.1f MiB)",
		time.Since(t0), float64(written1-written0)/(1<<20), float64(heap0)/(1<<20), float64(heap1)/(1<<20), float64(growth)/(1<<20))
	require.Less(t, growth, int64(written1-written0)/2, "nothing buffers the refused rows")

	tr.setOutage(nil)
	h.waitDelivered(scaled(t, 3*time.Minute))
	h.requireClean()
	refused, _ := tr.counts()
	s.rows, s.resets = rowCount(h.gen, tables, h.start, h.end), h.coll.Stats().TotalResets()
	s.faults = fmtFaults("all sends refused while %.0f MiB written: %d refused", float64(written1-written0)/(1<<20), refused)
	require.Equal(t, uint64(s.rows), h.chk.stats().RowsApplied, "every row applied exactly once after the congestion")
	h.requireBounded()
}

// steadyHeapOutsideStorage is the least of a few heapOutsideStorage
// samples: a buffer that grows with the data is in every sample, transient
// work (a scan in progress) is not.
func steadyHeapOutsideStorage() int64 {
	least := int64(math.MaxInt64)
	for range 3 {
		least = min(least, heapOutsideStorage())
		time.Sleep(50 * time.Millisecond) // spread the samples over the upstream's bursts
	}
	return least
}

// heapOutsideStorage returns the live heap after full collections, minus
// what the storage holds: pebble (its memtables and block cache, which
// under -race it allocates on the Go heap in one process out of two, and
// its iterators), the rows the generator allocated that wait in the
// store's bounded write queue (they come and go with its bursts), and the
// store's fresh rows (its bounded in-memory copy of the newest rows,
// eventstore.Options.FreshBytes, which nothing trims while no checkpoint
// moves). The
// store's data lives there by design; the claim measured is that nothing on
// the delivery path holds it. The storage's share is estimated from the
// runtime's allocation profile, scaled for sampling as pprof does.
func heapOutsideStorage() int64 {
	// The profile is as of the last completed cycle but one; the live heap
	// is what the last cycle marked (HeapAlloc would also count what other
	// goroutines allocated since).
	runtime.GC()
	runtime.GC()
	live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(live)
	n, _ := runtime.MemProfile(nil, true)
	recs := make([]runtime.MemProfileRecord, n+64)
	n, _ = runtime.MemProfile(recs, true)
	rate := float64(runtime.MemProfileRate)
	var storage float64
	for i := range recs[:n] {
		r := &recs[i]
		if r.InUseBytes() <= 0 || r.AllocObjects == 0 || !inStorage(r.Stack()) {
			continue
		}
		avg := float64(r.AllocBytes) / float64(r.AllocObjects)
		storage += float64(r.InUseBytes()) / (1 - math.Exp(-avg/rate))
	}
	return int64(live[0].Value.Uint64()) - int64(storage)
}

// inStorage reports whether an allocation was made by pebble, by the
// upstream generator or for the store's fresh rows.
func inStorage(stack []uintptr) bool {
	frames := runtime.CallersFrames(stack)
	for {
		f, more := frames.Next()
		if strings.Contains(f.Function, "cockroachdb/pebble") || strings.Contains(f.Function, "/pkg/upstream.") ||
			strings.Contains(f.Function, "/pkg/eventstore.(*Store).keepFreshLocked") {
			return true
		}
		if !more {
			return false
		}
	}
}

// storeBytes returns the bytes the event store accepted: committed to
// pebble, or kept in memory only (eventstore's write-behind).
func storeBytes(g prometheus.Gatherer) uint64 {
	mfs, err := g.Gather()
	if err != nil {
		return 0
	}
	var written, deferred, spilled float64
	for _, mf := range mfs {
		switch mf.GetName() {
		case "cdcflow_eventstore_bytes_written_total":
			written = mf.GetMetric()[0].GetCounter().GetValue()
		case "cdcflow_eventstore_bytes_deferred_total":
			deferred = mf.GetMetric()[0].GetCounter().GetValue()
		case "cdcflow_eventstore_bytes_spilled_total":
			spilled = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	// Rows kept in memory only at their commit are accepted too; those
	// written to pebble later are in written and deferred both.
	return uint64(written + deferred - spilled)
}

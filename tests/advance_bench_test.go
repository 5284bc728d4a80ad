package tests

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventcollector"
	"github.com/cdcflow/eventservice/pkg/eventservice"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

// advanceSinkForTest counts, per round, the dispatchers whose checkpoint
// reached the round's target; its per-dispatcher state is a slice indexed
// by table, so the sink costs an atomic per checkpoint.
type advanceSinkForTest struct {
	ckpt    []atomic.Uint64
	target  atomic.Uint64
	left    atomic.Int64
	done    atomic.Pointer[chan struct{}]
	begins  atomic.Int64
	allDone chan struct{}
}

func (s *advanceSinkForTest) BeginEpoch(common.DispatcherID, uint64, common.Ts) error {
	if s.begins.Add(1) == int64(len(s.ckpt)) {
		close(s.allDone)
	}
	return nil
}
func (s *advanceSinkForTest) ApplyRows(common.DispatcherID, []common.Row) error  { return nil }
func (s *advanceSinkForTest) ApplyDDL(common.DispatcherID, *messaging.DDL) error { return nil }
func (s *advanceSinkForTest) Checkpoint(id common.DispatcherID, ts common.Ts) error {
	prev := s.ckpt[id.Lo-1].Swap(uint64(ts))
	if t := s.target.Load(); prev < t && uint64(ts) >= t {
		if s.left.Add(-1) == 0 {
			close(*s.done.Load())
		}
	}
	return nil
}

// BenchmarkResolvedAdvances is the end-to-end resolved-ts throughput: one
// round pushes a resolved-ts advance (no rows) to each of N tables at the
// store's upstream sinks, in one eventstore.PushResolved call as a real
// upstream does, and ends when every dispatcher's sink has the new
// checkpoint (store -> notify -> pending sets -> fast path -> in-process
// transport -> collector -> sink). Reported as dispatcher advances/s.
func BenchmarkResolvedAdvances(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("dispatchers=%d", n), func(b *testing.B) { benchResolvedAdvances(b, n) })
	}
}

func benchResolvedAdvances(b *testing.B, n int) {
	up := &sparseUpstreamForTest{sinks: make(map[int64]eventstore.Sink, n)}
	ts := func(round int) common.Ts { return common.ComposeTs(1_700_000_000_000+int64(round)*1000, 0) }
	store, err := eventstore.Open(eventstore.Options{Upstream: up})
	if err != nil {
		b.Fatal(err)
	}
	must := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	must(store.Start())
	schema, err := schemastore.NewMemory(schemastore.MemoryOptions{InitialResolvedTs: ts(0)})
	must(err)
	inproc, err := messaging.NewInProcess(messaging.InProcessOptions{Capacity: 1 << 16})
	must(err)
	inbox, err := inproc.Register("bench")
	must(err)
	svc, err := eventservice.New(eventservice.Options{Store: store, Schema: schema, Transport: inproc})
	must(err)
	must(svc.Start())
	sink := &advanceSinkForTest{ckpt: make([]atomic.Uint64, n), allDone: make(chan struct{})}
	coll, err := eventcollector.New(eventcollector.Options{Service: svc, Inbox: inbox, Sink: sink})
	must(err)
	must(coll.Start())
	b.Cleanup(func() {
		must(coll.Close())
		must(svc.Close())
		must(store.Close())
		inproc.Close()
	})
	for i := range n {
		must(coll.AddDispatcher(context.Background(), common.DispatcherID{Lo: uint64(i + 1)}, common.TableSpan(int64(i+1)), ts(0)))
	}
	select {
	case <-sink.allDone:
	case <-time.After(5 * time.Minute):
		b.Fatalf("only %d of %d handshakes", sink.begins.Load(), n)
	}
	sinks := make([]eventstore.Sink, n)
	for i := range n {
		sinks[i] = up.sinks[int64(i+1)]
	}
	errs := make([]error, n)
	round := 0
	b.ResetTimer()
	cpu0 := processCPUForBench(b)
	var mem0 runtime.MemStats
	runtime.ReadMemStats(&mem0)
	for b.Loop() {
		round++
		target := ts(round)
		must(schema.AdvanceResolvedTs(target))
		done := make(chan struct{})
		sink.done.Store(&done)
		sink.left.Store(int64(n))
		sink.target.Store(uint64(target))
		eventstore.PushResolved(context.Background(), sinks, target, errs)
		must(errors.Join(errs...))
		select {
		case <-done:
		case <-time.After(5 * time.Minute):
			b.Fatalf("round %d: %d dispatchers did not advance", round, sink.left.Load())
		}
	}
	// The process's CPU per advance (every goroutine and system call of
	// the chain): on two shared cores the wall time of a round moves with
	// how the goroutines' hand-offs are scheduled (rounds of one build
	// took 5 or 8.5 ms from one run to the next), the work less.
	cpu := processCPUForBench(b) - cpu0
	// The bytes the process allocated per advance: what a million
	// dispatchers' cadence makes the GC collect (each cycle at that size
	// marks about 2 GB for seconds, so its rate is the cycles' rate).
	var mem runtime.MemStats
	runtime.ReadMemStats(&mem)
	advances := float64(n) * float64(b.N)
	b.ReportMetric(advances/b.Elapsed().Seconds(), "advances/s")
	b.ReportMetric(float64(cpu.Nanoseconds())/advances, "cpu-ns/advance")
	b.ReportMetric(float64(mem.TotalAlloc-mem0.TotalAlloc)/advances, "B/advance")
}

// processCPUForBench is the CPU time this process has used, user and
// system.
func processCPUForBench(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

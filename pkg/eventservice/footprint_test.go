package eventservice

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

// quietUpstreamForBench subscribes every span and never pushes: the
// dispatchers it feeds stay idle. (The upstream is the edge this benchmark
// is not about.)
type quietUpstreamForBench struct{}

type quietSubscriptionForBench struct{}

func (quietSubscriptionForBench) Close() {}

func (quietUpstreamForBench) Subscribe(common.Span, common.Ts, eventstore.Sink) (eventstore.Subscription, error) {
	return quietSubscriptionForBench{}, nil
}

// BenchmarkIdleFootprint registers n idle dispatchers, one table each, with
// the real service and the real store (in-memory pebble), lets every one of
// them be prepared (handshake sent), and reports the heap they hold, in
// bytes per dispatcher (service and store together; goal: at most 1 KiB),
// and the cost of one registration.
func BenchmarkIdleFootprint(b *testing.B) {
	for _, n := range []int{10_000, 200_000, 1_000_000} {
		b.Run(fmt.Sprintf("dispatchers=%d", n), func(b *testing.B) { benchIdleFootprint(b, n) })
	}
}

func benchIdleFootprint(b *testing.B, n int) {
	var perDispatcher, perRegister float64
	for b.Loop() {
		perDispatcher, perRegister = idleFootprint(b, n, 1, 0)
	}
	b.ReportMetric(perDispatcher, "B/dispatcher")
	b.ReportMetric(perRegister, "ns/register")
}

// BenchmarkRegisterBatch is BenchmarkIdleFootprint with the registrations
// in batches of messaging.MaxRegisterBatch (RegisterBatch, the path
// cdcserver and a collector take) and, as cdcserver does, the store and
// the service told how many to expect (ExpectedDispatchers), reporting the
// cost per registration: the goal is a million (service and store) in at
// most 3 s.
func BenchmarkRegisterBatch(b *testing.B) {
	for _, n := range []int{200_000, 1_000_000} {
		b.Run(fmt.Sprintf("dispatchers=%d", n), func(b *testing.B) {
			var perDispatcher, perRegister float64
			for b.Loop() {
				perDispatcher, perRegister = idleFootprint(b, n, messaging.MaxRegisterBatch, n)
			}
			b.ReportMetric(perDispatcher, "B/dispatcher")
			b.ReportMetric(perRegister, "ns/register")
		})
	}
}

// idleFootprint measures one population of n idle dispatchers, registered
// one call each (batch 1) or batch to a call, with the store and the
// service told to expect the given number (0: no hint).
func idleFootprint(b *testing.B, n, batch, expected int) (bytesPerDispatcher, nsPerRegister float64) {
	b.Helper()
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)

	store, err := eventstore.Open(eventstore.Options{Upstream: quietUpstreamForBench{}, ExpectedDispatchers: expected})
	if err != nil {
		b.Fatal(err)
	}
	if err := store.Start(); err != nil {
		b.Fatal(err)
	}
	schema, err := schemastore.NewMemory(schemastore.MemoryOptions{InitialResolvedTs: 1})
	if err != nil {
		b.Fatal(err)
	}
	svc, err := New(Options{Store: store, Schema: schema, Transport: acceptAllForBench{}, ExpectedDispatchers: expected})
	if err != nil {
		b.Fatal(err)
	}
	// Idle means prepared: every handshake sent, nothing queued.
	var prepared atomic.Int64
	allPrepared := make(chan struct{})
	svc.knobs = hooks{prepared: func(*session, prepareOutcome) {
		if prepared.Add(1) == int64(n) {
			close(allPrepared)
		}
	}}.knobs()
	if err := svc.Start(); err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	reqs := make([]messaging.RegisterRequest, 0, batch)
	for i := range n {
		reqs = append(reqs, messaging.RegisterRequest{Dispatcher: common.DispatcherIDFromUint64(uint64(i + 1)), Registration: 1,
			Span: common.TableSpan(int64(i + 1)), StartTs: 10, Target: "t"})
		if len(reqs) < batch && i < n-1 {
			continue
		}
		if batch == 1 {
			if err := svc.Register(context.Background(), reqs[0]); err != nil {
				b.Fatal(err)
			}
		} else {
			reply, err := svc.RegisterBatch(context.Background(), messaging.RegisterBatchRequest{Requests: reqs})
			if err != nil {
				b.Fatal(err)
			}
			for k, code := range reply.Codes {
				if code != messaging.CodeOK {
					b.Fatalf("entry %d of a batch: code %v", k, code)
				}
			}
		}
		reqs = reqs[:0]
	}
	nsPerRegister = float64(time.Since(start).Nanoseconds()) / float64(n)
	<-allPrepared
	runtime.GC()
	runtime.ReadMemStats(&after)
	bytesPerDispatcher = float64(after.HeapAlloc-before.HeapAlloc) / float64(n)

	b.StopTimer()
	if err := svc.Close(); err != nil {
		b.Fatal(err)
	}
	if err := store.Close(); err != nil {
		b.Fatal(err)
	}
	b.StartTimer()
	return bytesPerDispatcher, nsPerRegister
}

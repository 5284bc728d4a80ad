package eventservice

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

// BenchmarkKeepaliveRound is one keepalive round over n sessions that all
// published in the interval before, as at a resolved-ts cadence equal to
// SignalInterval: every session is examined, found young and carried over.
// This is the keepalive's whole cost at a million dispatchers advancing
// every second; reported per session examined. The store and the transport
// are no-op fakes, the edges the round does not touch.
//
// The sessions publish in the order they were allocated (order=allocated,
// as when tables advance in groups of consecutive IDs) or shuffled
// (order=shuffled, as when each table has a phase of its own): the same
// round, its cost set by where its first touches fall in memory.
func BenchmarkKeepaliveRound(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		for _, shuffled := range []bool{false, true} {
			order := map[bool]string{false: "allocated", true: "shuffled"}[shuffled]
			b.Run(fmt.Sprintf("sessions=%d/order=%s", n, order), func(b *testing.B) { benchKeepaliveRound(b, n, shuffled) })
		}
	}
}

func benchKeepaliveRound(b *testing.B, n int, shuffled bool) {
	schema, err := schemastore.NewMemory(schemastore.MemoryOptions{InitialResolvedTs: 1})
	if err != nil {
		b.Fatal(err)
	}
	fc := clock.NewFake(time.Unix(1_700_000_000, 0))
	svc, err := New(Options{Store: nopStoreForBench{}, Schema: schema, Transport: acceptAllForBench{}, Clock: fc})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = svc.Close() })
	ss := make([]*session, n)
	for i := range n {
		id := common.DispatcherIDFromUint64(uint64(i + 1))
		if err := svc.Register(context.Background(), messaging.RegisterRequest{Dispatcher: id, Registration: 1,
			Span: common.TableSpan(int64(i + 1)), StartTs: 10, Target: "t"}); err != nil {
			b.Fatal(err)
		}
		ss[i] = dispatcherForTest(svc, id).session.Load()
	}
	if shuffled {
		rand.New(rand.NewPCG(uint64(n), 1)).Shuffle(len(ss), func(i, j int) { ss[i], ss[j] = ss[j], ss[i] })
	}
	publishAll := func(ts common.Ts) {
		now := fc.Now()
		for _, s := range ss {
			s.publish(ts, 1, now)
		}
	}
	var spare []*session
	publishAll(20)
	spare = svc.keepaliveRound(spare) // the registration's queue entries are not in any list; this settles it
	examined := 0
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		fc.Advance(svc.opts.SignalInterval / 2)
		publishAll(common.Ts(30 + i))
		b.StartTimer()
		before := svc.kaSet.len()
		spare = svc.keepaliveRound(spare)
		examined += before
	}
	if examined > 0 {
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(examined), "ns/session")
	}
}

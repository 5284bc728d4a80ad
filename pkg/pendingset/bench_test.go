package pendingset_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdcflow/eventservice/pkg/pendingset"
)

// dispatcherID and resolved mirror the first user: key = dispatcher ID (a
// comparable 128-bit struct), value = {epoch, seq, resolvedTs}.
type dispatcherID struct{ Hi, Lo uint64 }

type resolved struct{ Epoch, Seq, ResolvedTs uint64 }

// newer keeps the newer of two resolved messages: higher epoch, then
// higher seq.
func newer(old, new resolved) resolved {
	if new.Epoch > old.Epoch || (new.Epoch == old.Epoch && new.Seq >= old.Seq) {
		return new
	}
	return old
}

func benchKeys(n int) []dispatcherID {
	ks := make([]dispatcherID, n)
	for i := range ks {
		ks[i] = dispatcherID{Hi: uint64(i) * 0x9e3779b97f4a7c15, Lo: uint64(i)}
	}
	return ks
}

func newBenchSet(b *testing.B) *pendingset.Set[dispatcherID, resolved] {
	// Metrics on, as in production: the figures include their cost.
	s, err := pendingset.New(pendingset.Options[dispatcherID, resolved]{
		Merge: newer, Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// consume runs a live consumer until stop is closed: doorbell, then drain
// until empty, every key delivered.
func consume(s *pendingset.Set[dispatcherID, resolved], stop <-chan struct{}) {
	var batch []pendingset.Entry[dispatcherID, resolved]
	for {
		select {
		case <-stop:
			return
		case <-s.Doorbell():
		}
		for {
			batch = s.Drain(0, batch[:0])
			if len(batch) == 0 {
				break
			}
			_ = s.Complete(batch, nil)
		}
	}
}

// BenchmarkAdd measures Add for 1 hot key, 1k keys and 100k keys, with one
// or GOMAXPROCS producers, against a stalled consumer (every add after the
// first per key coalesces) and a live one (keys are drained and inserted
// again).
func BenchmarkAdd(b *testing.B) {
	for _, keys := range []int{1, 1_000, 100_000} {
		for _, parallel := range []bool{false, true} {
			for _, live := range []bool{false, true} {
				name := fmt.Sprintf("keys=%d/producers=%s/consumer=%s", keys,
					map[bool]string{false: "single", true: "parallel"}[parallel],
					map[bool]string{false: "stalled", true: "live"}[live])
				b.Run(name, func(b *testing.B) { benchAdd(b, keys, parallel, live, false) })
			}
		}
	}
}

// benchAdd adds to keys keys, from one producer or in parallel, with the
// consumer stalled or live; shuffled visits them in a fixed random order
// instead of insertion order (single producer).
func benchAdd(b *testing.B, keys int, parallel, live, shuffled bool) {
	s := newBenchSet(b)
	ks := benchKeys(keys)
	for _, k := range ks { // warm the map and the node slice
		s.Add(k, resolved{})
	}
	if shuffled {
		ks = slices.Clone(ks)
		rand.New(rand.NewPCG(1, 2)).Shuffle(len(ks), func(i, j int) { ks[i], ks[j] = ks[j], ks[i] })
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	if live {
		wg.Go(func() { consume(s, stop) })
	} else {
		<-s.Doorbell() // stalled: nobody will ever drain
	}
	before := s.Stats()
	b.ReportAllocs()
	b.ResetTimer()
	if parallel {
		var seed sync.Mutex
		next := 0
		b.RunParallel(func(pb *testing.PB) {
			seed.Lock()
			j := (next * 7919) % keys
			next++
			seed.Unlock()
			seq := uint64(0)
			for pb.Next() {
				seq++
				s.Add(ks[j], resolved{Epoch: 1, Seq: seq, ResolvedTs: seq})
				if j++; j == keys {
					j = 0
				}
			}
		})
	} else {
		j := 0
		for i := range b.N {
			s.Add(ks[j], resolved{Epoch: 1, Seq: uint64(i), ResolvedTs: uint64(i)})
			if j++; j == keys {
				j = 0
			}
		}
	}
	b.StopTimer()
	close(stop)
	wg.Wait()
	after := s.Stats()
	adds := float64(after.Adds - before.Adds)
	b.ReportMetric(float64(after.Coalesced-before.Coalesced)/adds, "coalesced/add")
	if live {
		if d := after.Drains - before.Drains - (after.EmptyDrains - before.EmptyDrains); d > 0 {
			b.ReportMetric(float64(after.Drained-before.Drained)/float64(d), "keys/drain")
		}
	}
}

// BenchmarkBaselineBlockingChannel is what Flyte has today: a blocking
// send into a 256-slot channel drained by a live consumer, one payload per
// receive. Compare its ns/op with BenchmarkAdd's.
func BenchmarkBaselineBlockingChannel(b *testing.B) {
	for _, parallel := range []bool{false, true} {
		b.Run("producers="+map[bool]string{false: "single", true: "parallel"}[parallel], func(b *testing.B) {
			ch := make(chan dispatcherID, 256)
			var wg sync.WaitGroup
			wg.Go(func() {
				for range ch {
				}
			})
			ks := benchKeys(1_000)
			b.ReportAllocs()
			b.ResetTimer()
			if parallel {
				b.RunParallel(func(pb *testing.PB) {
					j := 0
					for pb.Next() {
						ch <- ks[j]
						if j++; j == len(ks) {
							j = 0
						}
					}
				})
			} else {
				for i := range b.N {
					ch <- ks[i%len(ks)]
				}
			}
			b.StopTimer()
			close(ch)
			wg.Wait()
		})
	}
}

// BenchmarkDrainComplete measures the consumer side: one op drains and
// completes one key, in batches of 512.
func BenchmarkDrainComplete(b *testing.B) {
	s := newBenchSet(b)
	ks := benchKeys(512)
	var batch []pendingset.Entry[dispatcherID, resolved]
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += len(ks) {
		for _, k := range ks {
			s.Add(k, resolved{Seq: uint64(i)})
		}
		batch = s.Drain(0, batch[:0])
		_ = s.Complete(batch, nil)
	}
}

// BenchmarkAddShuffled is Add on a real key stream: 100k keys visited in a
// fixed random order (BenchmarkAdd visits them in insertion order, which
// walks the node slice sequentially and hides its cache misses), with the
// consumer stalled or live. Issue 12 compares it with client-go's
// workqueue on the same stream.
func BenchmarkAddShuffled(b *testing.B) {
	for _, live := range []bool{false, true} {
		name := map[bool]string{false: "keys=100000/consumer=stalled", true: "keys=100000/consumer=live"}[live]
		b.Run(name, func(b *testing.B) { benchAdd(b, 100_000, false, live, true) })
	}
}

// BenchmarkAddManyDistinct is AddMany as the event service's preparation
// calls it at a million dispatchers: batches of 256 keys from a stream of
// 1M distinct keys in a fixed random order, into a set that holds 64k idle
// nodes from an earlier backlog (so every insert repurposes the
// longest-idle node, cold: its node, its slot, its key's index entry),
// each batch then drained and completed. In ns per key added.
func BenchmarkAddManyDistinct(b *testing.B) {
	const keys, idle, batchLen = 1_000_000, 65_536, 256
	s := newBenchSet(b)
	ks := benchKeys(keys)
	rand.New(rand.NewPCG(keys, 3)).Shuffle(len(ks), func(i, j int) { ks[i], ks[j] = ks[j], ks[i] })
	vals := make([]resolved, batchLen)
	var batch []pendingset.Entry[dispatcherID, resolved]
	drainAll := func() {
		for {
			batch = s.Drain(0, batch[:0])
			if len(batch) == 0 {
				return
			}
			_ = s.Complete(batch, nil)
		}
	}
	for i := 0; i < idle; i += batchLen {
		s.AddMany(ks[i:i+batchLen], vals)
	}
	drainAll()
	next := idle
	b.ReportAllocs()
	b.ResetTimer()
	added := 0
	for added < b.N {
		if next+batchLen > len(ks) {
			next = 0
		}
		s.AddMany(ks[next:next+batchLen], vals)
		next += batchLen
		added += batchLen
		drainAll()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(added), "ns/key")
}

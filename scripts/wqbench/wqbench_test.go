package wqbench

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"k8s.io/client-go/util/workqueue"

	"github.com/cdcflow/eventservice/pkg/pendingset"
)

const keys = 100_000

type key struct{ Hi, Lo uint64 }

// stream returns the keys and the fixed random order both queues visit.
func stream() (ks, order []key) {
	ks = make([]key, keys)
	for i := range ks {
		ks[i] = key{Hi: 1, Lo: uint64(i)}
	}
	order = slices.Clone(ks)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	return ks, order
}

func BenchmarkAddShuffled(b *testing.B) {
	for _, live := range []bool{false, true} {
		consumer := map[bool]string{false: "stalled", true: "live"}[live]
		b.Run(fmt.Sprintf("queue=pendingset/consumer=%s", consumer), func(b *testing.B) { benchPendingSet(b, live) })
		b.Run(fmt.Sprintf("queue=workqueue/consumer=%s", consumer), func(b *testing.B) { benchWorkqueue(b, live) })
	}
}

func benchPendingSet(b *testing.B, live bool) {
	s, err := pendingset.New(pendingset.Options[key, uint64]{Merge: func(_, v uint64) uint64 { return v }})
	if err != nil {
		b.Fatal(err)
	}
	ks, order := stream()
	for _, k := range ks {
		s.Add(k, 0)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	if live {
		wg.Go(func() {
			var batch []pendingset.Entry[key, uint64]
			for {
				select {
				case <-stop:
					return
				case <-s.Doorbell():
				}
				for {
					if batch = s.Drain(0, batch[:0]); len(batch) == 0 {
						break
					}
					_ = s.Complete(batch, nil)
				}
			}
		})
	}
	b.ReportAllocs()
	b.ResetTimer()
	j := 0
	for i := range b.N {
		s.Add(order[j], uint64(i))
		if j++; j == keys {
			j = 0
		}
	}
	b.StopTimer()
	close(stop)
	wg.Wait()
}

func benchWorkqueue(b *testing.B, live bool) {
	q := workqueue.NewTyped[key]()
	ks, order := stream()
	for _, k := range ks {
		q.Add(k)
	}
	var wg sync.WaitGroup
	if live {
		wg.Go(func() {
			for {
				k, shutdown := q.Get()
				if shutdown {
					return
				}
				q.Done(k)
			}
		})
	}
	b.ReportAllocs()
	b.ResetTimer()
	j := 0
	for range b.N {
		q.Add(order[j])
		if j++; j == keys {
			j = 0
		}
	}
	b.StopTimer()
	q.ShutDown()
	wg.Wait()
}

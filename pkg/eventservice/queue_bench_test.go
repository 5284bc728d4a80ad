package eventservice

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkPrepareQueue is a preparation queue's whole work at n
// dispatchers that all advance once: every session pushed (in a shuffled
// order, as notifications of tables with phases of their own arrive) and
// popped by a worker in batches of prepareBatchMax, which reads them in the
// order they were pushed, unrelated to where they lie in memory. Reported
// per session pushed and popped.
func BenchmarkPrepareQueue(b *testing.B) {
	for _, n := range []int{10_000, 1_000_000} {
		b.Run(fmt.Sprintf("sessions=%d", n), func(b *testing.B) {
			sessions := make([]*session, n)
			for i := range sessions {
				d := &dispatcher{}
				sessions[i] = &d.first
				sessions[i].d = d
			}
			rand.New(rand.NewPCG(uint64(n), 11)).Shuffle(n, func(i, j int) { sessions[i], sessions[j] = sessions[j], sessions[i] })
			q := newPrepareQueue()
			var dst [prepareBatchMax]*session
			b.ReportAllocs()
			b.ResetTimer()
			done := 0
			for done < b.N {
				for _, s := range sessions {
					q.push(s)
				}
				for q.popMany(dst[:]) > 0 {
				}
				done += n
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(done), "ns/session")
		})
	}
}

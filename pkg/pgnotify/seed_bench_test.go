package pgnotify

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcflow/eventservice/internal/latency"
	"github.com/cdcflow/eventservice/internal/pgtest"
)

// Seed 001's scenario: 8 producers update 10k keys (2k updates each in the
// publisher's run) through a link with a ~4 ms round trip (2 ms each way,
// through pgtest's proxy). The seed's design (a blocking 256-slot channel,
// one pg_notify per round trip) is measured over fewer updates: at a round
// trip per update it would take minutes for 200k. updates/s counts updates
// accepted and delivered (the newest per key) end to end; notifications/s
// the pg_notify calls made (the publisher coalesces, the FIFO does not);
// lost-keys the keys whose newest payload a listener (connected directly,
// not through the proxy) had not received 30 s after the run.
const (
	seedKeys      = 10_000
	seedProducers = 8
	seedOneWay    = 2 * time.Millisecond
	// keysPerProducer: each producer owns its keys, so a key's newest
	// payload is well defined (the last its one producer sent).
	keysPerProducer = seedKeys / seedProducers
)

func BenchmarkSeedScenario(b *testing.B) {
	srv := pgtest.Start(b)
	proxy := pgtest.StartProxy(b, srv.Addr, seedOneWay)
	dsn := "postgres://postgres@" + proxy.Addr + "/postgres?sslmode=disable"
	b.Run("design=pgnotify/updates=200000", func(b *testing.B) { benchPublisher(b, srv.DSN, dsn, 200_000, 1) })
	b.Run("design=pgnotify/connections=4/updates=200000", func(b *testing.B) { benchPublisher(b, srv.DSN, dsn, 200_000, 4) })
	b.Run("design=seed-fifo/updates=1000", func(b *testing.B) { benchSeedFIFO(b, srv.DSN, dsn, 1_000) })
}

// expectedFinal is each key's newest version (its payload after "key=")
// after producers(updates, ...).
func expectedFinal(updates int) map[string]string {
	m := map[string]string{}
	for w := range seedProducers {
		for i := range updates / seedProducers {
			k := w*keysPerProducer + i%keysPerProducer
			m[fmt.Sprint(k)] = fmt.Sprint(i) // the listener keeps what follows "key="
		}
	}
	return m
}

// producers runs seedProducers goroutines that together make updates
// sends through send, timing each.
func producers(updates int, send func(key, payload string)) *latency.Histogram {
	var h latency.Histogram
	var wg sync.WaitGroup
	per := updates / seedProducers
	for w := range seedProducers {
		wg.Go(func() {
			for i := range per {
				k := w*keysPerProducer + i%keysPerProducer
				key, payload := fmt.Sprint(k), fmt.Sprintf("%d=%d", k, i)
				start := time.Now()
				send(key, payload)
				h.Record(time.Since(start))
			}
		})
	}
	wg.Wait()
	return &h
}

// seedListener listens on the seed channel for one iteration's payloads.
func seedListener(b *testing.B, directDSN string, updates int) (*listenForTest, context.CancelFunc) {
	want := expectedFinal(updates)
	return listenFor(b, directDSN, "seed", &listenForTest{expect: want, want: len(want)})
}

// reportLoss waits up to 30 s for the listener to have every key's newest
// payload and reports the keys that are still missing it.
func reportLoss(b *testing.B, l *listenForTest, stop context.CancelFunc) {
	select {
	case <-l.done:
	case <-time.After(30 * time.Second): // a bound on a benchmark's wait, not synchronisation
	}
	stop()
	lost := 0
	for k, v := range l.expect {
		if l.newest[k] != v {
			lost++
		}
	}
	b.ReportMetric(float64(lost), "lost-keys")
}

func reportSends(b *testing.B, h *latency.Histogram) {
	b.ReportMetric(float64(h.Quantile(0.5).Nanoseconds()), "send-p50-ns")
	b.ReportMetric(float64(h.Quantile(0.99).Nanoseconds()), "send-p99-ns")
}

func benchPublisher(b *testing.B, directDSN, dsn string, updates, conns int) {
	for b.Loop() {
		l, stop := seedListener(b, directDSN, updates)
		p, err := New(Options{DSN: dsn, Connections: conns})
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Start(); err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		h := producers(updates, func(k, v string) {
			if err := p.Publish("seed", k, v); err != nil {
				b.Error(err)
			}
		})
		produced := time.Since(start)
		if err := p.Close(context.Background(), true); err != nil {
			b.Fatal(err)
		}
		total := time.Since(start)
		b.ReportMetric(float64(updates)/total.Seconds(), "updates/s")
		b.ReportMetric(float64(p.set.Stats().Delivered)/total.Seconds(), "notifications/s")
		b.ReportMetric(float64(updates)/produced.Seconds(), "produced/s")
		reportSends(b, h)
		reportLoss(b, l, stop)
	}
}

// benchSeedFIFO is the seed's design: producers block on a 256-slot
// channel; one sender makes a pg_notify round trip per payload.
func benchSeedFIFO(b *testing.B, directDSN, dsn string, updates int) {
	for b.Loop() {
		l, stop := seedListener(b, directDSN, updates)
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, dsn)
		if err != nil {
			b.Fatal(err)
		}
		type note struct{ key, payload string }
		fifo := make(chan note, 256)
		var sender sync.WaitGroup
		sender.Go(func() {
			for n := range fifo {
				if _, err := conn.Exec(ctx, "SELECT pg_notify($1, $2)", "seed", n.payload); err != nil {
					b.Error(err)
				}
			}
		})
		start := time.Now()
		h := producers(updates, func(k, v string) { fifo <- note{k, v} })
		close(fifo)
		sender.Wait()
		total := time.Since(start)
		_ = conn.Close(ctx)
		b.ReportMetric(float64(updates)/total.Seconds(), "updates/s")
		b.ReportMetric(float64(updates)/total.Seconds(), "notifications/s") // one per update
		reportSends(b, h)
		reportLoss(b, l, stop)
	}
}

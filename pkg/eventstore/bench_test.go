package eventstore

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
)

const (
	benchRowBytes  = 100
	benchBatchRows = 256
	benchScanRows  = 1 << 20
)

// benchEnv is a started in-memory store with one dispatcher on table 1.
type benchEnv struct {
	s    *Store
	sub  *fakeSubForTest
	rec  *recorder
	next common.Ts
}

func newBenchEnv(b *testing.B) *benchEnv {
	b.Helper()
	up := &fakeUpstreamForTest{}
	s, err := Open(Options{Upstream: up})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	rec := &recorder{ch: make(chan notification, 1<<16)}
	if err := s.RegisterDispatcher(did(1), common.TableSpan(1), 0, rec); err != nil {
		b.Fatal(err)
	}
	return &benchEnv{s: s, sub: up.subs()[0], rec: rec, next: 1}
}

// makeBatch builds n rows of benchRowBytes values, one transaction per
// 8 rows, at increasing commit-ts.
func (e *benchEnv) makeBatch(n int) Batch {
	rows := make([]common.Row, n)
	value := make([]byte, benchRowBytes)
	for i := range rows {
		if i%8 == 0 {
			e.next += 2
		}
		key := binary.BigEndian.AppendUint64(make([]byte, 0, 8), uint64(i))
		rows[i] = common.Row{Op: common.OpPut, Key: key, Value: value, StartTs: e.next - 1, CommitTs: e.next}
	}
	return Batch{Rows: rows, ResolvedTs: e.next}
}

// waitFor drains notifications until resolved reaches ts.
func (e *benchEnv) waitFor(b *testing.B, ts common.Ts) {
	for {
		select {
		case n := <-e.rec.ch:
			if n.resolved >= ts {
				return
			}
		case <-time.After(time.Minute):
			b.Fatal("store did not reach resolved-ts")
		}
	}
}

// fill commits n rows.
func (e *benchEnv) fill(b *testing.B, n int) {
	for n > 0 {
		k := min(n, 4096)
		if err := e.sub.sink.Push(context.Background(), e.makeBatch(k)); err != nil {
			b.Fatal(err)
		}
		n -= k
	}
	e.waitFor(b, e.next)
	// Scans compared with each other read the same (flushed) layout.
	if err := e.s.Flush(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkStoreWrite pushes 256-row batches of 100-byte rows and waits
// until they are committed and notified. One op is one batch.
func BenchmarkStoreWrite(b *testing.B) {
	e := newBenchEnv(b)
	batches := make([]Batch, 64)
	for i := range batches {
		batches[i] = e.makeBatch(benchBatchRows)
	}
	b.ReportAllocs()
	b.ResetTimer()
	var last common.Ts
	var bytes int64
	for i := 0; i < b.N; i++ {
		bt := batches[i%len(batches)]
		// Re-stamp the reused rows above the last resolved-ts.
		shift := e.next
		rows := make([]common.Row, len(bt.Rows))
		for j, r := range bt.Rows {
			r.CommitTs += shift
			r.StartTs += shift
			rows[j] = r
			bytes += int64(encodedKeyLen(r.Key) + encodedValueLen(&r))
		}
		last = bt.ResolvedTs + shift
		e.next = last
		if err := e.sub.sink.Push(context.Background(), Batch{Rows: rows, ResolvedTs: last}); err != nil {
			b.Fatal(err)
		}
	}
	e.waitFor(b, last)
	sec := b.Elapsed().Seconds()
	b.ReportMetric(float64(b.N*benchBatchRows)/sec, "rows/s")
	b.ReportMetric(float64(bytes)/sec/1e6, "MB/s")
}

// BenchmarkStoreScan iterates 1M committed rows through the store's
// iterator (decoding key and value). One op is the whole scan.
func BenchmarkStoreScan(b *testing.B) {
	e := newBenchEnv(b)
	e.fill(b, benchScanRows)
	end := e.next
	b.ReportAllocs()
	b.ResetTimer()
	var bytes int64
	for i := 0; i < b.N; i++ {
		it, err := e.s.NewIterator(did(1), ScanRange{Start: 0, End: end})
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for it.Next() {
			r := it.Row()
			bytes += int64(len(r.Key) + len(r.Value))
			n++
		}
		if err := it.Close(); err != nil || it.Err() != nil || n != benchScanRows {
			b.Fatalf("scan: %d rows, %v %v", n, err, it.Err())
		}
	}
	sec := b.Elapsed().Seconds()
	b.ReportMetric(float64(b.N*benchScanRows)/sec, "rows/s")
	b.ReportMetric(float64(bytes)/sec/1e6, "MB/s")
}

// BenchmarkRawPebbleScan iterates the same rows with a bare pebble iterator
// that reads each key and value: the physical limit BenchmarkStoreScan is
// measured against.
func BenchmarkRawPebbleScan(b *testing.B) {
	e := newBenchEnv(b)
	e.fill(b, benchScanRows)
	sub := e.sub.sink.(*sink).id
	b.ReportAllocs()
	b.ResetTimer()
	var bytes int64
	for i := 0; i < b.N; i++ {
		it, err := e.s.db.NewIter(&pebble.IterOptions{LowerBound: subBoundary(sub), UpperBound: subBoundary(sub + 1)})
		if err != nil {
			b.Fatal(err)
		}
		n := 0
		for ok := it.First(); ok; ok = it.Next() {
			v, _ := it.ValueAndErr()
			bytes += int64(len(it.Key()) - keyPrefixLen + len(v) - 3)
			n++
		}
		if err := it.Close(); err != nil || n != benchScanRows {
			b.Fatalf("raw scan: %d rows, %v", n, err)
		}
	}
	sec := b.Elapsed().Seconds()
	b.ReportMetric(float64(b.N*benchScanRows)/sec, "rows/s")
	b.ReportMetric(float64(bytes)/sec/1e6, "MB/s")
}

// BenchmarkNewIteratorAfterGC measures what a scan pays to start (open an
// iterator on a live subscription and read its first row) once `gcd`
// other subscriptions had their rows garbage-collected: their range
// tombstones sit in the memtable. GC writes a round's tombstones in one
// batch, so pebble fragments them once and every iterator afterwards reads
// the cached fragments; the figure to compare is the ratio between 1k and
// 100k GC'd subscriptions (target: within 2x).
func BenchmarkNewIteratorAfterGC(b *testing.B) {
	for _, gcd := range []int{1000, 100_000} {
		b.Run(fmt.Sprintf("gcd=%d", gcd), func(b *testing.B) { benchNewIteratorAfterGC(b, gcd) })
	}
}

func benchNewIteratorAfterGC(b *testing.B, gcd int) {
	up := &fakeUpstreamForTest{}
	clk := clock.NewFake(time.UnixMilli(1_700_000_000_000))
	// No fresh rows: the figure is what a pebble iterator pays.
	s, err := Open(Options{Upstream: up, Clock: clk, MaintenanceInterval: time.Hour, GCMinSpan: time.Millisecond, FreshBytes: -1})
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	ts := func(ms int64) common.Ts { return common.ComposeTs(1_700_000_000_000+ms, 0) }
	// Each dispatcher's notifier counts down once it saw every row
	// committed (checkpoints are capped at the committed resolved-ts).
	var committed sync.WaitGroup
	committed.Add(gcd + 1)
	notifier := func() Notifier {
		var once sync.Once
		return NotifierFunc(func(r, _ common.Ts) {
			if r >= ts(30) {
				once.Do(committed.Done)
			}
		})
	}
	row := func(k string, commit common.Ts) common.Row {
		return common.Row{Op: common.OpPut, Key: []byte(k), Value: make([]byte, benchRowBytes), StartTs: commit - 1, CommitTs: commit}
	}
	// Dispatcher 0 is the live one; 1..gcd get two rows each, then a
	// checkpoint above both, so a GC round deletes them.
	for i := 0; i <= gcd; i++ {
		if err := s.RegisterDispatcher(did(uint64(i+1)), common.TableSpan(int64(i+1)), 0, notifier()); err != nil {
			b.Fatal(err)
		}
	}
	for _, sub := range up.subs() {
		if err := sub.sink.Push(context.Background(), Batch{Rows: []common.Row{row("a", ts(10)), row("b", ts(20))}, ResolvedTs: ts(30)}); err != nil {
			b.Fatal(err)
		}
	}
	committed.Wait()
	for i := 1; i <= gcd; i++ {
		if err := s.UpdateCheckpoint(did(uint64(i+1)), ts(30)); err != nil {
			b.Fatal(err)
		}
	}
	s.maintain()
	if got := testutil.ToFloat64(s.metrics.gcRangesDeleted); got != float64(gcd) {
		b.Fatalf("%v ranges deleted, want %d", got, gcd)
	}
	b.ResetTimer()
	for b.Loop() {
		it, err := s.NewIterator(did(1), ScanRange{Start: 0, End: ts(30)})
		if err != nil {
			b.Fatal(err)
		}
		if !it.Next() {
			b.Fatal("no first row")
		}
		if err := it.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkScanNewestRow is the scan of a dispatcher that keeps up with a
// busy store: 1000 tables share a memtable of 256k rows, and each op opens
// an iterator on the newest transaction of one table and reads its row, as
// the scheduler does when every table gets a row now and then. from=memory
// serves it from the table's fresh rows, from=pebble (FreshBytes -1) seeks
// the memtable's skiplist; their ratio is the headline.
func BenchmarkScanNewestRow(b *testing.B) {
	for _, from := range []string{scanFromMemory, scanFromPebble} {
		b.Run("from="+from, func(b *testing.B) { benchScanNewestRow(b, from == scanFromPebble) })
	}
}

func benchScanNewestRow(b *testing.B, pebbleOnly bool) {
	const tables, rows = 1000, 256 << 10
	up := &fakeUpstreamForTest{}
	opts := Options{Upstream: up}
	if pebbleOnly {
		opts.FreshBytes = -1
	}
	s, err := Open(opts)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = s.Close() })
	var done sync.WaitGroup
	done.Add(tables)
	last := common.Ts(2 * (rows/tables + 1))
	for i := range tables {
		var once sync.Once
		n := func(r, _ common.Ts) {
			if r >= last {
				once.Do(done.Done)
			}
		}
		if err := s.RegisterDispatcher(did(uint64(i+1)), common.TableSpan(int64(i+1)), 0, NotifierFunc(n)); err != nil {
			b.Fatal(err)
		}
	}
	subs := up.subs()
	value := make([]byte, benchRowBytes)
	for t := 0; t < rows/tables+1; t++ {
		commit := common.Ts(2 * (t + 1))
		for i, sub := range subs {
			key := binary.BigEndian.AppendUint64(make([]byte, 0, 8), uint64(t*tables+i))
			row := common.Row{Op: common.OpPut, Key: key, Value: value, StartTs: commit - 1, CommitTs: commit}
			if err := sub.sink.Push(context.Background(), Batch{Rows: []common.Row{row}, ResolvedTs: commit}); err != nil {
				b.Fatal(err)
			}
		}
	}
	done.Wait()
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		it, err := s.NewIterator(did(uint64(i%tables+1)), ScanRange{Start: last - 2, End: last})
		if err != nil {
			b.Fatal(err)
		}
		if !it.Next() || it.Next() {
			b.Fatal("want exactly the newest row")
		}
		if err := it.Close(); err != nil {
			b.Fatal(err)
		}
		i++
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "scans/s")
}

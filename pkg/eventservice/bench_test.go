package eventservice

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/cdcflow/eventservice/internal/latency"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/schemastore"
	"github.com/cdcflow/eventservice/pkg/upstream"
)

// nopStoreForBench stands in for the event store in the notify benchmarks,
// which call the notifier directly (as the store's write workers do) and
// are about the service's notify path alone: registering a million
// dispatchers in pebble would measure the store instead.
type nopStoreForBench struct{}

var errNoRowsForBench = errors.New("bench store: no rows")

func (nopStoreForBench) RegisterDispatcher(common.DispatcherID, common.Span, common.Ts, eventstore.Notifier) error {
	return nil
}
func (nopStoreForBench) UnregisterDispatcher(common.DispatcherID) error        { return nil }
func (nopStoreForBench) UpdateCheckpoint(common.DispatcherID, common.Ts) error { return nil }
func (nopStoreForBench) NewIterator(common.DispatcherID, eventstore.ScanRange) (eventstore.RowIterator, error) {
	return nil, errNoRowsForBench
}

// acceptAllForBench accepts every message and keeps none.
type acceptAllForBench struct{}

func (acceptAllForBench) Send(messaging.Target, []messaging.Message) error { return nil }

// notifyBench is a started service with n dispatchers on the nop store.
type notifyBench struct {
	svc *Service
	ds  []*dispatcher
	// maxCommit is the hint notified: above the start-ts when saturated
	// (every preparation wants a scan), below it when idle (the fast path).
	maxCommit common.Ts
}

func newNotifyBench(b *testing.B, n int, saturate bool) *notifyBench {
	b.Helper()
	schema, err := schemastore.NewMemory(schemastore.MemoryOptions{InitialResolvedTs: 1 << 62})
	if err != nil {
		b.Fatal(err)
	}
	release := make(chan struct{})
	full := make(chan struct{}, 1)
	// Without saturation every registered dispatcher is prepared exactly
	// once (its handshake) before measuring; handshaken tells when.
	handshaken := make(chan struct{})
	var preparations atomic.Int64
	hk := hooks{}
	if !saturate {
		hk.prepared = func(*session, prepareOutcome) {
			if preparations.Add(1) == int64(n) {
				close(handshaken)
			}
		}
	}
	if saturate {
		hk.beforeScan = func(*session) { <-release }
		hk.scanChannelFull = func(*session) {
			select {
			case full <- struct{}{}:
			default:
			}
		}
	}
	svc, err := New(Options{Store: nopStoreForBench{}, Schema: schema, Transport: acceptAllForBench{}, ScanWorkers: 1, ScanQueueSize: 1})
	if err != nil {
		b.Fatal(err)
	}
	svc.knobs = hk.knobs()
	nb := &notifyBench{svc: svc, ds: make([]*dispatcher, n), maxCommit: 5}
	if saturate {
		nb.maxCommit = 15
	}
	for i := range n {
		id := common.DispatcherIDFromUint64(uint64(i + 1))
		if err := svc.Register(context.Background(), messaging.RegisterRequest{Dispatcher: id, Registration: 1,
			Span: common.TableSpan(int64(i + 1)), StartTs: 10, Target: "t"}); err != nil {
			b.Fatal(err)
		}
		nb.ds[i] = dispatcherForTest(svc, id)
	}
	if err := svc.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		close(release)
		_ = svc.Close()
	})
	if saturate {
		// Every dispatcher has rows above its progress: each preparation
		// wants a real scan; the held scan worker and the full channel
		// stall the preparation workers, and everyone else stays queued.
		for _, d := range nb.ds {
			d.Notify(20, 15)
		}
		<-full
	} else {
		<-handshaken // the workers hand-shook everyone; now measure
	}
	return nb
}

// run notifies round-robin with increasing resolved-ts, as the store does,
// then times 200k single calls for the tail.
func (nb *notifyBench) run(b *testing.B) {
	n := len(nb.ds)
	base := common.Ts(100)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ts := base + common.Ts(i/n)
		nb.ds[i%n].Notify(ts, nb.maxCommit)
	}
	b.StopTimer()
	var h latency.Histogram
	base += common.Ts(b.N/n + 1)
	for i := range 200_000 {
		d := nb.ds[i%n]
		ts := base + common.Ts(i/n)
		start := time.Now()
		d.Notify(ts, nb.maxCommit)
		h.Record(time.Since(start))
	}
	b.ReportMetric(float64(h.Quantile(0.999).Nanoseconds()), "p999-ns")
	b.ReportMetric(float64(h.Quantile(0.5).Nanoseconds()), "p50-ns")
}

// BenchmarkNotifySaturated: 100k dispatchers, the scan worker held, the
// scan channel full, the preparation worker waiting for room.
func BenchmarkNotifySaturated(b *testing.B) {
	newNotifyBench(b, 100_000, true).run(b)
}

// BenchmarkNotifyIdle: the same with the workers running.
func BenchmarkNotifyIdle(b *testing.B) {
	newNotifyBench(b, 100_000, false).run(b)
}

// BenchmarkNotifyScale: the notify cost at 1k and at 1M dispatchers, with
// the scan pipeline saturated (the notify path alone: every notification
// is absorbed) and with the workers running (each notification may also
// enqueue, competing with the preparation worker on the other core).
func BenchmarkNotifyScale(b *testing.B) {
	for _, mode := range []string{"saturated", "idle"} {
		for _, n := range []int{1_000, 1_000_000} {
			b.Run(fmt.Sprintf("mode=%s/dispatchers=%d", mode, n), func(b *testing.B) {
				newNotifyBench(b, n, mode == "saturated").run(b)
			})
		}
	}
}

const (
	scanBenchRows  = 1 << 19
	scanBenchBytes = 100
)

// scanBenchRowsOf returns the benchmark's rows: 8-row transactions of
// 100-byte values.
func scanBenchRowsOf() []common.Row {
	rows := make([]common.Row, scanBenchRows)
	value := make([]byte, scanBenchBytes)
	ts := common.Ts(10)
	for i := range rows {
		if i%8 == 0 {
			ts += 2
		}
		rows[i] = common.Row{Op: common.OpPut, Key: binary.BigEndian.AppendUint64(nil, uint64(i)), Value: value, StartTs: ts - 1, CommitTs: ts}
	}
	return rows
}

// BenchmarkScanThroughput: rows from the store through the scheduler to an
// in-process target whose receiver drains everything. One op delivers all
// rows to each of n freshly registered dispatchers of the span: with one,
// a single scan worker does all the work (one owner per dispatcher); with
// two, both scan workers do, as when many dispatchers catch up at once.
func BenchmarkScanThroughput(b *testing.B) {
	for _, n := range []int{1, 2} {
		b.Run(fmt.Sprintf("dispatchers=%d", n), func(b *testing.B) { benchScanThroughput(b, n) })
	}
}

func benchScanThroughput(b *testing.B, n int) {
	up := upstream.NewManual()
	store, err := eventstore.Open(eventstore.Options{Upstream: up})
	if err != nil {
		b.Fatal(err)
	}
	if err := store.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = store.Close() }()
	schema, _ := schemastore.NewMemory(schemastore.MemoryOptions{InitialResolvedTs: 1 << 40})
	inproc, _ := messaging.NewInProcess(messaging.InProcessOptions{Capacity: 1 << 14})
	inbox, _ := inproc.Register("t")
	svc, err := New(Options{Store: store, Schema: schema, Transport: inproc})
	if err != nil {
		b.Fatal(err)
	}
	if err := svc.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = svc.Close() }()

	// Load the rows once through a keeper dispatcher that holds the data.
	rows := scanBenchRowsOf()
	end := rows[len(rows)-1].CommitTs
	span := common.TableSpan(1)
	loaded := make(chan struct{})
	var loadedOnce sync.Once
	keeper := func(resolved, _ common.Ts) {
		if resolved >= end {
			loadedOnce.Do(func() { close(loaded) })
		}
	}
	if err := store.RegisterDispatcher(common.DispatcherIDFromUint64(1<<50), span, 0, eventstore.NotifierFunc(keeper)); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < len(rows); i += 4096 {
		bt := eventstore.Batch{Rows: rows[i:min(i+4096, len(rows))]}
		if i+4096 >= len(rows) {
			bt.ResolvedTs = end
		}
		if err := up.Push(context.Background(), span, bt); err != nil {
			b.Fatal(err)
		}
	}
	<-loaded // every row is committed (the store notifies after commit)
	// Both this and the raw reference scan flushed sstables, so they read
	// the same layout (memtable flushes are otherwise timing-dependent).
	if err := store.Flush(); err != nil {
		b.Fatal(err)
	}

	b.ResetTimer()
	delivered := 0
	for i := 0; i < b.N; i++ {
		ids := make([]common.DispatcherID, n)
		for j := range ids {
			ids[j] = common.DispatcherIDFromUint64(uint64(i*n + j + 1))
			if err := svc.Register(context.Background(), messaging.RegisterRequest{Dispatcher: ids[j], Registration: 1,
				Span: span, StartTs: 1, Target: "t"}); err != nil {
				b.Fatal(err)
			}
		}
		var buf []messaging.Message
		for done := 0; done < n; {
			<-inbox.Ready()
			buf = inbox.Drain(buf[:0], 0)
			for _, m := range buf {
				switch msg := m.(type) {
				case *messaging.DMLBatch:
					delivered += len(msg.Rows)
				case *messaging.Resolved:
					if msg.Ts >= end {
						done++
					}
				case *messaging.ResolvedBatch:
					for i := range msg.Entries {
						if msg.Entries[i].Ts >= end {
							done++
						}
					}
				}
			}
			clear(buf)
		}
		b.StopTimer()
		for _, id := range ids {
			if err := svc.Remove(context.Background(), messaging.RemoveRequest{Dispatcher: id, Registration: 1}); err != nil {
				b.Fatal(err)
			}
		}
		b.StartTimer()
	}
	if delivered != b.N*n*scanBenchRows {
		b.Fatalf("delivered %d rows, want %d", delivered, b.N*n*scanBenchRows)
	}
	b.ReportMetric(float64(delivered)/b.Elapsed().Seconds(), "rows/s")
}

// BenchmarkRawPebbleScanReference iterates the same rows, encoded the same
// way (subscription, commit-ts, start-ts, key), with a bare pebble iterator
// that reads every key and value: the physical limit of the scheduler's
// scan on this machine.
func BenchmarkRawPebbleScanReference(b *testing.B) {
	// The same pebble configuration as the event store's defaults, and the
	// rows written the same way (4096-row batches), so both scans read the
	// same layout of memtables and sstables through the same cache size.
	cache := pebble.NewCache(eventstore.DefaultCacheBytes)
	defer cache.Unref()
	db, err := pebble.Open("", &pebble.Options{FS: vfs.NewMem(), DisableWAL: true, Cache: cache,
		MemTableSize: eventstore.DefaultMemTableBytes, Logger: quietPebbleForBench{}})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = db.Close() }()
	rows := scanBenchRowsOf()
	for i := 0; i < len(rows); i += 4096 {
		batch := db.NewBatch()
		for _, r := range rows[i:min(i+4096, len(rows))] {
			k := binary.BigEndian.AppendUint64(nil, 1)
			k = binary.BigEndian.AppendUint64(k, uint64(r.CommitTs))
			k = binary.BigEndian.AppendUint64(k, uint64(r.StartTs))
			k = append(k, r.Key...)
			v := append([]byte{1, byte(r.Op), scanBenchBytes}, r.Value...)
			if err := batch.Set(k, v, nil); err != nil {
				b.Fatal(err)
			}
		}
		if err := batch.Commit(pebble.NoSync); err != nil {
			b.Fatal(err)
		}
		_ = batch.Close()
	}
	if err := db.Flush(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	n := 0
	var sink int
	for i := 0; i < b.N; i++ {
		it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{0, 0, 0, 0, 0, 0, 0, 1}, UpperBound: []byte{0, 0, 0, 0, 0, 0, 0, 2}})
		if err != nil {
			b.Fatal(err)
		}
		for ok := it.First(); ok; ok = it.Next() {
			v, _ := it.ValueAndErr()
			sink += len(it.Key()) + len(v)
			n++
		}
		_ = it.Close()
	}
	if n != b.N*scanBenchRows || sink == 0 {
		b.Fatalf("iterated %d rows", n)
	}
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "rows/s")
}

// quietPebbleForBench keeps pebble's informational logs out of the
// benchmark output.
type quietPebbleForBench struct{}

func (quietPebbleForBench) Infof(string, ...any)           {}
func (quietPebbleForBench) Errorf(string, ...any)          {}
func (quietPebbleForBench) Fatalf(format string, a ...any) { panic(fmt.Sprintf(format, a...)) }

package upstream

import (
	"fmt"
	"testing"
	"time"

	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
)

// BenchmarkGeneratorRows measures the row function alone (one goroutine):
// each op generates 100ms of a 1M rows/s single-table workload.
func BenchmarkGeneratorRows(b *testing.B) {
	for _, rowBytes := range []int{16, 100, 1000} {
		for _, txnRows := range []int{1, 4, 64} {
			b.Run(fmt.Sprintf("rowBytes=%d/txnRows=%d", rowBytes, txnRows), func(b *testing.B) {
				g, err := NewGenerator(GeneratorOptions{
					Tables: 1, RowsPerSec: 1_000_000, TxnRows: txnRows, RowBytes: rowBytes,
					TxnsPerCommitTs: 4, Seed: 1, StartTs: common.TsFromTime(t0), Clock: clock.NewFake(t0),
				})
				if err != nil {
					b.Fatal(err)
				}
				defer g.Close()
				start := g.Options().StartTs
				end := start + common.ComposeTs(100, 0)
				rows := 0
				b.ResetTimer()
				for b.Loop() {
					rows += len(g.Rows(1, start, end))
				}
				elapsed := b.Elapsed()
				b.ReportMetric(float64(rows)/elapsed.Seconds(), "rows/s")
				b.ReportMetric(float64(elapsed.Nanoseconds())/float64(rows), "ns/row")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

// BenchmarkGeneratorRowCount measures the cheap count over an hour of a
// 1000-table workload (one table), the cost of sizing an oracle range.
func BenchmarkGeneratorRowCount(b *testing.B) {
	g, err := NewGenerator(GeneratorOptions{Seed: 1, StartTs: common.TsFromTime(t0), Clock: clock.NewFake(t0)})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	start := g.Options().StartTs
	end := start + common.TsFromTime(time.UnixMilli(0).Add(time.Hour))
	ticks := 0
	for b.Loop() {
		_ = g.RowCount(1, start, end)
		ticks += int(time.Hour / DefaultTick)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(ticks), "ns/tick")
}

// BenchmarkGeneratorRowsMillionTables is the end-of-run oracle of a
// million-table run (cdcserver synthetic --tables 1000000 --rate 20000): the rows of
// one table over 30 s. With sparse tables drawn block by block it costs
// about what the table's few rows cost, not 3,000 ticks.
func BenchmarkGeneratorRowsMillionTables(b *testing.B) {
	const tables = 1_000_000
	g, err := NewGenerator(GeneratorOptions{Seed: 1, Tables: tables, RowsPerSec: 20000, HotFraction: 0.5,
		StartTs: common.TsFromTime(t0), Clock: clock.NewFake(t0)})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Close()
	start := g.Options().StartTs
	end := start + common.TsFromTime(time.UnixMilli(0).Add(30*time.Second))
	table, rows := int64(0), 0
	for b.Loop() {
		table = table%tables + 1
		rows += len(g.Rows(table, start, end))
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/table")
	b.ReportMetric(float64(rows)/float64(b.N), "rows/table")
}

package tests

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/schemastore"
	"github.com/cdcflow/eventservice/pkg/upstream"
)

// ddlBook records every DDL added to the schema store, per table, so the
// oracle knows them. A DDL is recorded before the schema frontier passes
// it, hence before any dispatcher can be sent it.
type ddlBook struct {
	mu      sync.Mutex
	byTable map[int64][]schemastore.DDL
	total   int
}

func newDDLBook() *ddlBook { return &ddlBook{byTable: map[int64][]schemastore.DDL{}} }

// add records d, keeping each table's list sorted by commit-ts.
func (b *ddlBook) add(d schemastore.DDL) {
	b.mu.Lock()
	defer b.mu.Unlock()
	l := b.byTable[d.TableID]
	i, _ := slices.BinarySearchFunc(l, d.CommitTs, func(e schemastore.DDL, ts common.Ts) int { return cmp.Compare(e.CommitTs, ts) })
	b.byTable[d.TableID] = slices.Insert(l, i, d)
	b.total++
}

// between returns table's DDLs with commit-ts in (lo, hi].
func (b *ddlBook) between(table int64, lo, hi common.Ts) []schemastore.DDL {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []schemastore.DDL
	for _, d := range b.byTable[table] {
		if d.CommitTs > lo && d.CommitTs <= hi {
			out = append(out, d)
		}
	}
	return out
}

// len returns how many DDLs were recorded.
func (b *ddlBook) len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.total
}

// genOracle is the oracle of a Generator workload: its rows are a pure
// function of the options, so the checker can ask for any range.
type genOracle struct {
	gen    *upstream.Generator
	ddls   *ddlBook
	schema *schemastore.Memory
}

func (o *genOracle) Rows(table int64, lo, hi common.Ts) []common.Row {
	return o.gen.Rows(table, lo, hi)
}

func (o *genOracle) DDLs(table int64, lo, hi common.Ts) []schemastore.DDL {
	return o.ddls.between(table, lo, hi)
}

func (o *genOracle) Ceiling(int64) common.Ts {
	return min(o.gen.ResolvedTs(), o.schema.ResolvedTs())
}

// ddlPlan places the scheduled DDLs of a Generator workload: every
// everyTicks ticks, one table (picked by seed and tick) gets a DDL at the
// commit-ts of one of its rows in that tick, so DDLs share commit-ts with
// DML and must be delivered after it (at the tick's second timestamp if the
// table has no row there). It is a pure function of its inputs.
type ddlPlan struct {
	gen        *upstream.Generator
	seed       uint64
	tables     int
	everyTicks int64
	tickMs     int64
}

// inRange returns the planned DDLs with commit-ts in (lo, hi], in order.
func (p ddlPlan) inRange(lo, hi common.Ts) []schemastore.DDL {
	if p.everyTicks <= 0 || hi <= lo {
		return nil
	}
	var out []schemastore.DDL
	for k := lo.PhysicalMs() / p.tickMs; k <= hi.PhysicalMs()/p.tickMs; k++ {
		if k%p.everyTicks != 0 {
			continue
		}
		if d, ok := p.at(k); ok && d.CommitTs > lo && d.CommitTs <= hi {
			out = append(out, d)
		}
	}
	return out
}

// at returns the DDL planned in tick k, if the workload has that tick.
func (p ddlPlan) at(k int64) (schemastore.DDL, bool) {
	h := mix64(p.seed ^ uint64(k)*0x9e3779b97f4a7c15)
	table := int64(h%uint64(p.tables)) + 1
	base := common.ComposeTs(k*p.tickMs, 0)
	end := common.ComposeTs((k+1)*p.tickMs, 0) - 1
	o := p.gen.Options()
	if end <= o.StartTs || (o.EndTs != 0 && base+1 > o.EndTs) {
		return schemastore.DDL{}, false
	}
	commit := base + 1
	if rows := p.gen.Rows(table, base-1, end); len(rows) > 0 {
		commit = rows[int(h>>32)%len(rows)].CommitTs
	}
	if commit <= o.StartTs || (o.EndTs != 0 && commit > o.EndTs) {
		return schemastore.DDL{}, false
	}
	return schemastore.DDL{TableID: table, CommitTs: commit, Query: fmt.Sprintf("ALTER TABLE t%d ADD COLUMN c%d INT", table, k)}, true
}

// advanceSchema adds the planned DDLs in (schema frontier, to], records
// them, then moves the frontier to to.
func advanceSchema(schema *schemastore.Memory, plan ddlPlan, book *ddlBook, to common.Ts) error {
	from := schema.ResolvedTs()
	if to <= from {
		return nil
	}
	for _, d := range plan.inRange(from, to) {
		if err := schema.AddDDL(d); err != nil {
			return err
		}
		book.add(d)
	}
	return schema.AdvanceResolvedTs(to)
}

// mix64 is a splitmix64 finaliser: a fixed hash for seeded choices.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// workloadSpan returns a start-ts at the end of the tick before now and an
// end-ts d later, at the end of a tick, so the generator's frontier stops
// exactly at the end.
func workloadSpan(now time.Time, tick, d time.Duration) (start, end common.Ts) {
	tickMs := tick.Milliseconds()
	k := now.UnixMilli() / tickMs
	start = common.ComposeTs(k*tickMs, 0) - 1
	ticks := max(1, d.Milliseconds()/tickMs)
	end = common.ComposeTs((k+ticks)*tickMs, 0) - 1
	return start, end
}

// rowCount sums the upstream's rows of the given tables (one entry per
// dispatcher) in (lo, hi].
func rowCount(gen *upstream.Generator, tables []int64, lo, hi common.Ts) int64 {
	var n int64
	for _, t := range tables {
		n += int64(gen.RowCount(t, lo, hi))
	}
	return n
}

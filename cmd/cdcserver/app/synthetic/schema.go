package synthetic

import (
	"fmt"
	"time"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

// ddlSchedule is the deterministic DDL workload: the k-th DDL (k >= 1) has
// commit-ts start + k*interval and goes to a table picked by (seed, k).
// Like the row workload it is a pure function of the configuration, so a
// restarted server and the verifier agree on it.
type ddlSchedule struct {
	seed     uint64
	tables   int
	interval time.Duration
	start    common.Ts
	end      common.Ts
}

// at returns the k-th DDL.
func (d ddlSchedule) at(k int64) schemastore.DDL {
	ms := d.start.PhysicalMs() + k*d.interval.Milliseconds()
	table := int64(splitmix(d.seed^uint64(k)*0x9e3779b97f4a7c15)%uint64(d.tables)) + 1
	return schemastore.DDL{TableID: table, CommitTs: common.ComposeTs(ms, 0), Query: fmt.Sprintf("ALTER TABLE t%d COMMENT 'ddl %d'", table, k)}
}

// until returns the DDLs with commit-ts in (from, to], in order.
func (d ddlSchedule) until(from, to common.Ts) []schemastore.DDL {
	if d.interval <= 0 {
		return nil
	}
	var out []schemastore.DDL
	// Start at the first DDL after from, not at the first of the run: the
	// generator calls this every tick (advanceSchema), and a walk from k = 1
	// built every DDL so far each time.
	first := int64(1)
	if iv := d.interval.Milliseconds(); iv > 0 && from > d.start {
		first = max(first, (from.PhysicalMs()-d.start.PhysicalMs())/iv)
	}
	for k := first; ; k++ {
		dl := d.at(k)
		if dl.CommitTs > to || dl.CommitTs > d.end {
			return out
		}
		if dl.CommitTs > from && dl.CommitTs > d.start {
			out = append(out, dl)
		}
	}
}

// forTable returns the DDLs of table with commit-ts in (from, to].
func (d ddlSchedule) forTable(table int64, from, to common.Ts) []schemastore.DDL {
	var out []schemastore.DDL
	for _, dl := range d.until(from, to) {
		if dl.TableID == table {
			out = append(out, dl)
		}
	}
	return out
}

// splitmix is a fixed, process-independent 64-bit mixer.
func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
	x = (x ^ x>>27) * 0x94d049bb133111eb
	return x ^ x>>31
}

// advanceSchema adds the DDLs in (schema frontier, to] and advances to to.
// The generator calls it (OnFrontier) each time its frontier moves, before
// it feeds any table up to it: like a real upstream, whose DDLs are in the
// log before the rows after them, the schema frontier is never behind the
// tables' resolved-ts, so an advance never parks on it. (It lagged one
// 10 ms tick of its own phase once, to exercise the schema-blocked path:
// every advance parked and was prepared twice, and the resolved-ts lag
// carried the phase. The service's and tests/'s suites exercise that path.)
func advanceSchema(schema *schemastore.Memory, sched ddlSchedule, to common.Ts) {
	from := schema.ResolvedTs()
	if to <= from {
		return
	}
	for _, dl := range sched.until(from, to) {
		_ = schema.AddDDL(dl) // above the frontier by construction
	}
	_ = schema.AdvanceResolvedTs(to)
}

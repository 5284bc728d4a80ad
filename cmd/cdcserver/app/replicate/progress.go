package replicate

import (
	"fmt"
	"io"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// progress prints serve's progress line: rows applied per second, lag,
// pending tasks; during the initial snapshot, tables and rows copied, the
// rate and an estimate of what is left; while a table that joined is
// copied, its name, its rows so far and the tables queued.
type progress struct {
	p        *parts
	w        io.Writer
	lastRows float64
	lastAt   time.Time
}

func newProgress(p *parts, w io.Writer) *progress {
	return &progress{p: p, w: w, lastAt: time.Now()}
}

// rowsApplied reads the sink's row counter from the registry.
func (g *progress) rowsApplied() float64 {
	mfs, err := g.p.reg.Gather()
	if err != nil {
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() == "cdcflow_pgsink_rows_total" {
			return sumOf(mf.GetMetric())
		}
	}
	return 0
}

func sumOf(ms []*dto.Metric) float64 {
	var v float64
	for _, m := range ms {
		v += m.GetCounter().GetValue()
	}
	return v
}

func (g *progress) print() {
	now := time.Now()
	rows := g.rowsApplied()
	rate := (rows - g.lastRows) / now.Sub(g.lastAt).Seconds()
	g.lastRows, g.lastAt = rows, now
	st := g.p.svc.Progress()
	line := fmt.Sprintf("serve: %s  rows/s %.0f  lag %v  pending prepare %d scan %d  stopped tables %d", g.p.health.current(), rate,
		g.p.lag().Round(time.Millisecond), st.PendingPrepare, st.PendingScan, len(g.p.sink.Stopped()))
	if snap := g.p.source.Snapshot(); snap.Running {
		copyRate := float64(snap.Rows) / max(snap.Elapsed.Seconds(), 0.001)
		left := "unknown"
		if snap.EstimatedRows > snap.Rows && copyRate > 0 {
			left = (time.Duration(float64(snap.EstimatedRows-snap.Rows)/copyRate) * time.Second).Round(time.Second).String()
		}
		line += fmt.Sprintf("  snapshot: tables %d/%d, rows %d of ~%d, %.0f rows/s, ~%s left", snap.TablesDone, snap.Tables,
			snap.Rows, snap.EstimatedRows, copyRate, left)
	}
	if g.p.health.current() == phaseSnapshotApply {
		// Read from the source, not yet durable in the target: the
		// target is no cut-over point until every table is.
		done := 0
		for _, rel := range g.p.info.Tables {
			if g.p.sink.Durable(dispatcherOf(rel.OID)) >= g.p.info.SnapshotTs {
				done++
			}
		}
		line += fmt.Sprintf("  snapshot: read, applying: %d of %d tables durable in the target", done, len(g.p.info.Tables))
	}
	line += g.p.copier.status()
	fmt.Fprintln(g.w, line)
}

package server

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

// Quantiles is a p50/p99/max triple.
type Quantiles struct {
	P50 float64 `json:"p50"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// Summary is the run's verdict; with --json it is printed as one object.
type Summary struct {
	Verified        bool      `json:"verified"`
	Interrupted     bool      `json:"interrupted"`
	Complete        bool      `json:"complete"`
	Dispatchers     int       `json:"dispatchers"`
	Tables          int       `json:"tables"`
	Changefeeds     int       `json:"changefeeds"`
	RowsUpstream    int64     `json:"rows_upstream"`
	RowsDelivered   int64     `json:"rows_delivered"`
	RowsApplied     uint64    `json:"rows_applied"`
	RowsPerSec      float64   `json:"rows_per_sec"`
	DDLsUpstream    int       `json:"ddls_upstream"`
	DDLsDelivered   int       `json:"ddls_delivered"`
	Resets          uint64    `json:"resets"`
	Moves           int64     `json:"moves"`
	LostWakeups     int       `json:"lost_wakeups"`
	OrderViolations int       `json:"order_violations"`
	Duplicates      int       `json:"duplicates"`
	MissingRows     int       `json:"missing_rows"`
	UnexpectedRows  int       `json:"unexpected_rows"`
	DDLMismatches   int       `json:"ddl_mismatches"`
	NotifyNs        Quantiles `json:"notify_ns"`
	ResolvedLagMs   Quantiles `json:"resolved_lag_ms"`
	// WarmupSec is how long, after the upstream started, the dispatchers
	// took to catch up with the rows produced while they were registered;
	// ResolvedLagMs is sampled after it. Warm is false when some
	// dispatcher was still catching up when the upstream ended: then no
	// lag was sampled (the system did not keep up at all).
	WarmupSec float64 `json:"warmup_sec"`
	Warm      bool    `json:"warm"`
	// WallSec is the whole run, registration and verification included;
	// PeakRSSMB the process's peak resident set (getrusage), so a scale
	// figure carries its memory; Flags the command line.
	WallSec          float64 `json:"wall_sec"`
	PeakRSSMB        float64 `json:"peak_rss_mb"`
	Flags            string  `json:"flags"`
	PeakPendingTasks int     `json:"peak_pending_tasks"`
	PeakPendingPrep  int     `json:"peak_pending_prepare"`
	PeakPendingScan  int     `json:"peak_pending_scan"`
	CoalescedRatio   float64 `json:"coalesced_ratio"`
	Notifications    uint64  `json:"notifications"`
	FaultsInjected   uint64  `json:"faults_injected"`
	ElapsedSec       float64 `json:"elapsed_sec"`
	MetricsAddr      string  `json:"metrics_addr,omitempty"`
	// Role is the process's --role; with collectors in other processes,
	// CollectorRestarts counts the collector processes started again after
	// they exited on their own, Reconnects their data streams opened
	// again, and Reregistered the dispatchers they registered again (from
	// their checkpoints, under new registrations) after those reconnects.
	Role              string   `json:"role"`
	CollectorRestarts int      `json:"collector_restarts"`
	Reconnects        int64    `json:"reconnects"`
	Reregistered      int64    `json:"reregistered"`
	Problems          []string `json:"problems,omitempty"`
}

const maxProblems = 20

func (s *Summary) problem(format string, args ...any) {
	if len(s.Problems) < maxProblems {
		s.Problems = append(s.Problems, fmt.Sprintf(format, args...))
	}
}

// verify compares, for every dispatcher, what its sink received with what
// the upstream produced in (start-ts, final]: each epoch's rows in order
// and without duplicates, the deduplicated union equal to the upstream's
// rows, the DDLs equal to the schedule's, and the final checkpoint at the
// upstream's final resolved-ts (otherwise: a lost wakeup).
func (s *server) verify(r *runResult, finals map[common.DispatcherID]common.Ts) Summary {
	sum := Summary{Interrupted: r.interrupted, Complete: r.complete, Tables: s.cfg.Tables, Changefeeds: s.cfg.Changefeeds,
		ElapsedSec: r.elapsed.Seconds(), PeakPendingTasks: r.peakPending, PeakPendingPrep: r.peakPrepare,
		PeakPendingScan: r.peakScan, RowsApplied: r.lastApplied, MetricsAddr: s.metricsAddr(), WarmupSec: r.warmup.Seconds(), Warm: r.warm}
	st := s.store.Stats()
	sum.NotifyNs = Quantiles{float64(st.NotifyP50.Nanoseconds()), float64(st.NotifyP99.Nanoseconds()), float64(st.NotifyMax.Nanoseconds())}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	sum.ResolvedLagMs = Quantiles{ms(r.lag.Quantile(0.5)), ms(r.lag.Quantile(0.99)), ms(r.lag.Max())}
	p := s.svc.Progress()
	sum.Notifications, sum.CoalescedRatio = p.Notifications, ratio(p.Coalesced, p.Notifications)
	if s.faulty != nil {
		fs := s.faulty.Stats()
		sum.FaultsInjected = fs.Refused + fs.Failed + fs.Dropped
	}
	sum.Resets = s.resets()
	if s.mover != nil {
		sum.Moves = s.mover.moves.Load()
	}
	for _, f := range s.feeds {
		for _, d := range f.ds {
			sum.Dispatchers++
			final := finals[d.id]
			s.verifyDispatcher(&sum, f, d, final)
		}
	}
	if r.elapsed > 0 {
		sum.RowsPerSec = float64(sum.RowsDelivered) / r.elapsed.Seconds()
	}
	sum.Verified = sum.LostWakeups == 0 && sum.OrderViolations == 0 && sum.Duplicates == 0 && sum.MissingRows == 0 &&
		sum.UnexpectedRows == 0 && sum.DDLMismatches == 0 && (r.complete || r.interrupted)
	if !r.complete && !r.interrupted {
		sum.problem("delivery did not complete within --drain-timeout")
	}
	return sum
}

func (s *server) verifyDispatcher(sum *Summary, f *feed, d dispatcherRef, final common.Ts) {
	from := d.startTs
	if f.mem == nil {
		from = s.meta.StartTs // a durable sink holds every run on this data dir
	}
	want := s.gen.Rows(d.table, from, final)
	sum.RowsUpstream += int64(len(want))
	wantDDLs := s.sched.forTable(d.table, from, final)
	sum.DDLsUpstream += len(wantDDLs)
	if f.mem == nil {
		s.verifyDurable(sum, f.durable, d, final, want, wantDDLs)
		return
	}
	// A sink that was never asked to checkpoint is at its start-ts.
	ckpt := max(f.mem.CheckpointOf(d.id), d.startTs)
	if ckpt < final {
		sum.LostWakeups++
		sum.problem("%v (table %d): checkpoint %v behind the upstream's final resolved-ts %v; %s",
			d.id, d.table, ckpt, final, s.diag[d.id])
	}
	for _, ep := range f.mem.Epochs(d.id) {
		if ep.CheckpointRegressions > 0 {
			sum.OrderViolations += ep.CheckpointRegressions
			sum.problem("%v epoch %d: %d checkpoints not above the previous one", d.id, ep.Epoch, ep.CheckpointRegressions)
		}
		for i := 1; i < len(ep.Rows); i++ {
			switch c := compareRows(&ep.Rows[i-1], &ep.Rows[i]); {
			case c == 0:
				sum.Duplicates++
				sum.problem("%v epoch %d: row %x@%v applied twice", d.id, ep.Epoch, ep.Rows[i].Key, ep.Rows[i].CommitTs)
			case c > 0:
				sum.OrderViolations++
				sum.problem("%v epoch %d: row %x@%v after %x@%v", d.id, ep.Epoch, ep.Rows[i].Key, ep.Rows[i].CommitTs, ep.Rows[i-1].Key, ep.Rows[i-1].CommitTs)
			}
		}
	}
	got := f.mem.Deduplicated(d.id)
	sum.RowsDelivered += int64(len(got))
	s.diffRows(sum, d, want, got)
	gotDDLs := dedupDDLs(f.mem.AppliedDDLs(d.id))
	sum.DDLsDelivered += len(gotDDLs)
	compareDDLs(sum, d, gotDDLs, wantDDLs)
}

// compareDDLs counts a mismatch if got is not the scheduled DDLs want.
func compareDDLs(sum *Summary, d dispatcherRef, gotDDLs []messaging.DDL, wantDDLs []schemastore.DDL) {
	if len(gotDDLs) != len(wantDDLs) {
		sum.DDLMismatches++
		sum.problem("%v (table %d): %d DDLs delivered, %d scheduled", d.id, d.table, len(gotDDLs), len(wantDDLs))
		return
	}
	for i := range wantDDLs {
		if gotDDLs[i].CommitTs != wantDDLs[i].CommitTs || gotDDLs[i].Query != wantDDLs[i].Query {
			sum.DDLMismatches++
			sum.problem("%v: DDL %d is %q@%v, want %q@%v", d.id, i, gotDDLs[i].Query, gotDDLs[i].CommitTs, wantDDLs[i].Query, wantDDLs[i].CommitTs)
			return
		}
	}
}

// diffRows counts rows the upstream produced that are missing, and rows
// delivered that the upstream never produced (or that differ).
func (s *server) diffRows(sum *Summary, d dispatcherRef, want, got []common.Row) {
	i, j := 0, 0
	for i < len(want) || j < len(got) {
		var c int
		switch {
		case i == len(want):
			c = 1
		case j == len(got):
			c = -1
		default:
			c = compareRows(&want[i], &got[j])
		}
		switch {
		case c < 0:
			sum.MissingRows++
			sum.problem("%v (table %d): row %x@%v missing", d.id, d.table, want[i].Key, want[i].CommitTs)
			i++
		case c > 0:
			sum.UnexpectedRows++
			sum.problem("%v (table %d): unexpected row %x@%v", d.id, d.table, got[j].Key, got[j].CommitTs)
			j++
		default:
			if want[i].Op != got[j].Op || !bytes.Equal(want[i].Value, got[j].Value) {
				sum.UnexpectedRows++
				sum.problem("%v (table %d): row %x@%v differs", d.id, d.table, got[j].Key, got[j].CommitTs)
			}
			i++
			j++
		}
	}
}

func compareRows(a, b *common.Row) int {
	if c := cmp.Compare(a.CommitTs, b.CommitTs); c != 0 {
		return c
	}
	if c := cmp.Compare(a.StartTs, b.StartTs); c != 0 {
		return c
	}
	return bytes.Compare(a.Key, b.Key)
}

func dedupDDLs(ddls []messaging.DDL) []messaging.DDL {
	var out []messaging.DDL
	for _, dl := range ddls {
		if len(out) > 0 && out[len(out)-1].CommitTs >= dl.CommitTs {
			continue // re-delivered after a reset
		}
		out = append(out, dl)
	}
	return out
}

// verifyDurable checks a durable sink: exactly the upstream's versions,
// each once, per key applied in commit-ts order, and the scheduled DDLs.
func (s *server) verifyDurable(sum *Summary, sink *DurableSink, d dispatcherRef, final common.Ts, want []common.Row, wantDDLs []schemastore.DDL) {
	if sink == nil {
		sum.LostWakeups++
		sum.MissingRows += len(want)
		sum.problem("%v (table %d): its collector's sink could not be read", d.id, d.table)
		return
	}
	ckpt, err := sink.CheckpointOf(d.id)
	ckpt = max(ckpt, d.startTs)
	if err != nil {
		sum.problem("%v: read checkpoint: %v", d.id, err)
		sum.LostWakeups++
		return
	}
	if ckpt < final {
		sum.LostWakeups++
		sum.problem("%v (table %d): durable checkpoint %v behind %v", d.id, d.table, ckpt, final)
	}
	versions, err := sink.Versions(d.table)
	if err != nil {
		sum.problem("%v: read sink: %v", d.id, err)
		sum.MissingRows += len(want)
		return
	}
	verifyVersions(sum, d, want, versions)
	got, err := sink.DDLs(d.table)
	if err != nil {
		sum.DDLMismatches++
		sum.problem("%v: read DDLs: %v", d.id, err)
		return
	}
	// The sink holds DDLs up to its checkpoint, which may pass final after
	// an interruption; compare the scheduled range only.
	got = slices.DeleteFunc(got, func(dl messaging.DDL) bool { return dl.CommitTs > final })
	sum.DDLsDelivered += len(got)
	compareDDLs(sum, d, got, wantDDLs)
}

// verifyVersions compares stored versions with the upstream's rows of the
// whole workload for one table.
func verifyVersions(sum *Summary, d dispatcherRef, want []common.Row, versions []Version) {
	type vk struct {
		key      string
		commitTs common.Ts
	}
	wantSet := make(map[vk]*common.Row, len(want))
	for i := range want {
		wantSet[vk{string(want[i].Key), want[i].CommitTs}] = &want[i]
	}
	sum.RowsDelivered += int64(len(versions))
	// The order check compares neighbours, so it needs each key's versions
	// together, in commit-ts order. The sink's scan gives that order;
	// verification does not rely on it (the raw key layout once broke it
	// for keys that prefix others, and the check missed violations).
	byKeyThenTs := func(a, b Version) int {
		return cmp.Or(bytes.Compare(a.Key, b.Key), cmp.Compare(a.CommitTs, b.CommitTs))
	}
	if !slices.IsSortedFunc(versions, byKeyThenTs) {
		versions = slices.Clone(versions)
		slices.SortFunc(versions, byKeyThenTs)
	}
	seen := make(map[vk]bool, len(versions))
	for i, v := range versions {
		k := vk{string(v.Key), v.CommitTs}
		w, ok := wantSet[k]
		switch {
		case seen[k]:
			sum.Duplicates++
		case !ok:
			sum.UnexpectedRows++
			sum.problem("table %d: unexpected version %x@%v", d.table, v.Key, v.CommitTs)
		case w.Op != v.Op || !bytes.Equal(w.Value, v.Value):
			sum.UnexpectedRows++
			sum.problem("table %d: version %x@%v differs", d.table, v.Key, v.CommitTs)
		}
		seen[k] = true
		// Versions are sorted by key, then commit-ts: per key, a later
		// commit-ts must have been applied later.
		if i > 0 && bytes.Equal(versions[i-1].Key, v.Key) && versions[i-1].Seq > v.Seq {
			sum.OrderViolations++
			sum.problem("table %d: key %x@%v applied before %x@%v", d.table, v.Key, v.CommitTs, versions[i-1].Key, versions[i-1].CommitTs)
		}
	}
	for k := range wantSet {
		if !seen[k] {
			sum.MissingRows++
			sum.problem("table %d: row %x@%v missing", d.table, []byte(k.key), k.commitTs)
		}
	}
}

// writeSummary prints the summary: one JSON object, or text.
func writeSummary(w io.Writer, asJSON bool, s Summary) error {
	if asJSON {
		enc := json.NewEncoder(w)
		return enc.Encode(s)
	}
	verdict := "VERIFIED"
	if !s.Verified {
		verdict = "VERIFICATION FAILED"
	}
	warmup := fmt.Sprintf("after a %.1fs warm-up", s.WarmupSec)
	if !s.Warm {
		warmup = "not sampled: the dispatchers never caught up with the registration period"
	}
	_, err := fmt.Fprintf(w, `%s
  dispatchers        %d (%d tables x %d changefeeds)
  rows               upstream %d, delivered %d (applied %d incl. re-deliveries), %.0f rows/s over %.1fs
  DDLs               upstream %d, delivered %d
  resets             %d   faults injected %d   moves %d
  lost wakeups       %d   order violations %d   duplicates %d   missing %d   unexpected %d   DDL mismatches %d
  notify callback    p50 %.0f ns   p99 %.0f ns   max %.0f ns   (%d notifications, %.1f%% coalesced)
  resolved-ts lag    p50 %.1f ms   p99 %.1f ms   max %.1f ms   (%s)
  peak pending tasks %d (prepare %d, scan %d)
  wall               %.1fs (registration and verification included), peak RSS %.0f MB
`, verdict, s.Dispatchers, s.Tables, s.Changefeeds, s.RowsUpstream, s.RowsDelivered, s.RowsApplied, s.RowsPerSec, s.ElapsedSec,
		s.DDLsUpstream, s.DDLsDelivered, s.Resets, s.FaultsInjected, s.Moves, s.LostWakeups, s.OrderViolations, s.Duplicates,
		s.MissingRows, s.UnexpectedRows, s.DDLMismatches, s.NotifyNs.P50, s.NotifyNs.P99, s.NotifyNs.Max, s.Notifications,
		100*s.CoalescedRatio, s.ResolvedLagMs.P50, s.ResolvedLagMs.P99, s.ResolvedLagMs.Max, warmup, s.PeakPendingTasks,
		s.PeakPendingPrep, s.PeakPendingScan, s.WallSec, s.PeakRSSMB)
	if err != nil {
		return err
	}
	for _, p := range s.Problems {
		if _, err := fmt.Fprintf(w, "  problem: %s\n", p); err != nil {
			return err
		}
	}
	return nil
}

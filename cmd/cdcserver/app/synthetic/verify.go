package synthetic

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/cdcflow/eventservice/cmd/cdcserver/app/exitcode"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/pebblesink"
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
	// Verdict is VerdictVerified, VerdictNotDrained or VerdictFailed
	// (decideVerdict); Verified is Verdict == VerdictVerified.
	Verdict     string `json:"verdict"`
	Verified    bool   `json:"verified"`
	Interrupted bool   `json:"interrupted"`
	Complete    bool   `json:"complete"`
	// Drained is whether every dispatcher had reached its final target
	// (the upstream's final resolved-ts, or after an interruption what the
	// store had committed) by the drain deadline: only then are the gaps
	// of a dispatcher loss. BehindDispatchers counts those that had not;
	// above each one's checkpoint, the upstream rows and DDLs its sink does
	// not hold are UndeliveredRows and UndeliveredDDLs (late, not lost),
	// and SlowestLagMs is how far the slowest one's checkpoint was behind
	// its final target at the deadline (commit-ts time, not wall time),
	// SlowestDispatcher who it was. Complete is the same fact as Drained,
	// kept under its earlier name.
	Drained           bool    `json:"drained"`
	BehindDispatchers int     `json:"behind_dispatchers"`
	UndeliveredRows   int64   `json:"undelivered_rows"`
	UndeliveredDDLs   int     `json:"undelivered_ddls"`
	SlowestLagMs      float64 `json:"slowest_lag_ms"`
	SlowestDispatcher string  `json:"slowest_dispatcher,omitempty"`
	Dispatchers       int     `json:"dispatchers"`
	Tables            int     `json:"tables"`
	Changefeeds       int     `json:"changefeeds"`
	RowsUpstream      int64   `json:"rows_upstream"`
	RowsDelivered     int64   `json:"rows_delivered"`
	RowsApplied       uint64  `json:"rows_applied"`
	RowsPerSec        float64 `json:"rows_per_sec"`
	DDLsUpstream      int     `json:"ddls_upstream"`
	DDLsDelivered     int     `json:"ddls_delivered"`
	Resets            uint64  `json:"resets"`
	Moves             int64   `json:"moves"`
	LostWakeups       int     `json:"lost_wakeups"`
	OrderViolations   int     `json:"order_violations"`
	Duplicates        int     `json:"duplicates"`
	MissingRows       int     `json:"missing_rows"`
	UnexpectedRows    int     `json:"unexpected_rows"`
	DDLMismatches     int     `json:"ddl_mismatches"`
	// SinkErrors counts dispatchers whose sink could not be read: nothing
	// about them is proven, and the run fails.
	SinkErrors    int       `json:"sink_errors"`
	NotifyNs      Quantiles `json:"notify_ns"`
	ResolvedLagMs Quantiles `json:"resolved_lag_ms"`
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
	WallSec   float64 `json:"wall_sec"`
	PeakRSSMB float64 `json:"peak_rss_mb"`
	Flags     string  `json:"flags"`
	// THP is the host's transparent-huge-page mode (Linux's
	// /sys/kernel/mm/transparent_hugepage/enabled: always, madvise or
	// never; empty where unknown). The Go runtime asks for no huge pages,
	// so only "always" backs the heap with them, and at a million
	// dispatchers that cuts the CPU of an advance by a third to a half
	// (docs/design/cdcserver.md).
	THP              string  `json:"thp,omitempty"`
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

// Verdicts (Summary.Verdict).
const (
	// VerdictVerified: drained, and the sinks hold exactly the upstream's
	// rows and DDLs, in order, without duplicates.
	VerdictVerified = "verified"
	// VerdictNotDrained: some dispatcher was behind at the drain deadline
	// (delivery slower than the offered load, or stuck: a run cannot tell
	// which), and nothing the sinks hold proves a violation.
	VerdictNotDrained = "not_drained"
	// VerdictFailed: a violation proven from what the sinks hold, drained
	// or not: a row or DDL out of order, twice, not the upstream's, or
	// missing at or below the checkpoint its sink confirmed; a drained
	// dispatcher whose sink lacks the final checkpoint (a lost wakeup); a
	// sink that cannot be read.
	VerdictFailed = "failed"
)

// violations counts what proves delivery wrong, drained or not.
func (s *Summary) violations() int {
	return s.LostWakeups + s.OrderViolations + s.Duplicates + s.MissingRows + s.UnexpectedRows + s.DDLMismatches + s.SinkErrors
}

// decideVerdict is a run's verdict. A proven violation fails the run
// whether it drained or not (a late run can still prove a loss); without
// one, a run is verified only if it drained: before that, a gap may be
// delivery that had not happened yet.
func decideVerdict(drained bool, violations int) string {
	switch {
	case violations > 0:
		return VerdictFailed
	case !drained:
		return VerdictNotDrained
	default:
		return VerdictVerified
	}
}

// ExitStatus is cdcserver's exit status for a run that produced s: one
// per verdict (exitcode.OK, NotDrained, Failed).
func ExitStatus(s Summary) int {
	switch decideVerdict(s.Drained, s.violations()) {
	case VerdictVerified:
		return exitcode.OK
	case VerdictNotDrained:
		return exitcode.NotDrained
	default:
		return exitcode.Failed
	}
}

// window is what verification demands of one dispatcher: the upstream's
// rows and DDLs up to final; those at or below certified must be in its
// sink (absent, they are missing: lost), those above it and absent are
// undelivered. certified is final unless the dispatcher was behind at the
// drain deadline; then it is the checkpoint its sink holds, which
// certifies everything at or below it as applied.
type window struct {
	final, certified common.Ts
}

// windowOf is d's window from its final target, the checkpoint its sink
// holds, and whether it was behind at the drain deadline.
func windowOf(final, sinkCkpt common.Ts, behind bool) window {
	if !behind {
		return window{final: final, certified: final}
	}
	return window{final: final, certified: min(sinkCkpt, final)}
}

// lagOf is how far ckpt is behind final, in commit-ts time.
func lagOf(final, ckpt common.Ts) time.Duration {
	return time.Duration(max(final.PhysicalMs()-ckpt.PhysicalMs(), 0)) * time.Millisecond
}

// slowestBehind picks, among the dispatchers behind at the drain deadline,
// the one whose checkpoint then was furthest behind its final target (the
// smallest ID among equals, so the choice does not depend on map order).
func slowestBehind(late map[common.DispatcherID]lateAt, finals map[common.DispatcherID]common.Ts) (common.DispatcherID, time.Duration, bool) {
	var (
		best    common.DispatcherID
		bestLag time.Duration
		found   bool
	)
	for id, l := range late {
		lag := lagOf(finals[id], l.ckpt)
		if !found || lag > bestLag || lag == bestLag && cmp.Or(cmp.Compare(id.Hi, best.Hi), cmp.Compare(id.Lo, best.Lo)) < 0 {
			best, bestLag, found = id, lag, true
		}
	}
	return best, bestLag, found
}

func (s *Summary) problem(format string, args ...any) {
	if len(s.Problems) < maxProblems {
		s.Problems = append(s.Problems, fmt.Sprintf(format, args...))
	}
}

// verify compares, for every dispatcher, what its sink received with what
// the upstream produced in (start-ts, final]: each epoch's rows in order
// and without duplicates, the deduplicated union equal to the upstream's
// rows, the DDLs equal to the schedule's, and the final checkpoint at the
// upstream's final resolved-ts (otherwise: a lost wakeup). A dispatcher
// behind at the drain deadline is held to what its sink's checkpoint
// certifies (window); what lies above it and is absent is undelivered.
func (s *server) verify(r *runResult, finals map[common.DispatcherID]common.Ts) Summary {
	sum := Summary{Interrupted: r.interrupted, Complete: r.complete, Drained: r.complete, Tables: s.cfg.Tables, Changefeeds: s.cfg.Changefeeds,
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
			_, behind := r.late[d.id]
			s.verifyDispatcher(&sum, f, d, final, behind)
		}
	}
	if r.elapsed > 0 {
		sum.RowsPerSec = float64(sum.RowsDelivered) / r.elapsed.Seconds()
	}
	if id, lag, ok := slowestBehind(r.late, finals); ok {
		l := r.late[id]
		sum.SlowestLagMs = ms(lag)
		sum.SlowestDispatcher = fmt.Sprintf("%v (table %d): checkpoint %v at the drain deadline, final %v; %s", id, l.table, l.ckpt, finals[id], s.diag[id])
	}
	sum.Verdict = decideVerdict(sum.Drained, sum.violations())
	sum.Verified = sum.Verdict == VerdictVerified
	return sum
}

// judge classifies d from the checkpoint its sink holds: behind at the
// drain deadline (counted), or drained, when a sink without the final
// checkpoint lost it (a lost wakeup). It returns d's window.
func (s *server) judge(sum *Summary, d dispatcherRef, final, ckpt common.Ts, behind bool) window {
	switch {
	case behind:
		sum.BehindDispatchers++
	case ckpt < final:
		sum.LostWakeups++
		sum.problem("%v (table %d): checkpoint %v behind the upstream's final resolved-ts %v, though it had reached it by the drain deadline; %s",
			d.id, d.table, ckpt, final, s.diag[d.id])
	}
	return windowOf(final, ckpt, behind)
}

func (s *server) verifyDispatcher(sum *Summary, f *feed, d dispatcherRef, final common.Ts, behind bool) {
	from := d.startTs
	if f.mem == nil {
		from = s.meta.StartTs // a durable sink holds every run on this data dir
	}
	want := s.gen.Rows(d.table, from, final)
	sum.RowsUpstream += int64(len(want))
	wantDDLs := s.sched.forTable(d.table, from, final)
	sum.DDLsUpstream += len(wantDDLs)
	if f.mem == nil {
		s.verifyDurable(sum, f.durable, d, final, behind, want, wantDDLs)
		return
	}
	// A sink that was never asked to checkpoint is at its start-ts.
	w := s.judge(sum, d, final, max(f.mem.CheckpointOf(d.id), d.startTs), behind)
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
	diffRows(sum, d, want, got, w)
	gotDDLs := dedupDDLs(f.mem.AppliedDDLs(d.id))
	sum.DDLsDelivered += len(gotDDLs)
	compareDDLs(sum, d, gotDDLs, wantDDLs, w)
}

// compareDDLs counts a mismatch unless got is the scheduled DDLs want, or,
// for a dispatcher behind at the deadline, a prefix of them that holds
// every one at or below w.certified; the rest are undelivered.
func compareDDLs(sum *Summary, d dispatcherRef, gotDDLs []messaging.DDL, wantDDLs []schemastore.DDL, w window) {
	for i := range gotDDLs {
		if i == len(wantDDLs) {
			sum.DDLMismatches++
			sum.problem("%v (table %d): %d DDLs delivered, %d scheduled", d.id, d.table, len(gotDDLs), len(wantDDLs))
			return
		}
		if gotDDLs[i].CommitTs != wantDDLs[i].CommitTs || gotDDLs[i].Query != wantDDLs[i].Query {
			sum.DDLMismatches++
			sum.problem("%v: DDL %d is %q@%v, want %q@%v", d.id, i, gotDDLs[i].Query, gotDDLs[i].CommitTs, wantDDLs[i].Query, wantDDLs[i].CommitTs)
			return
		}
	}
	if n := len(gotDDLs); n < len(wantDDLs) {
		if wantDDLs[n].CommitTs <= w.certified {
			sum.DDLMismatches++
			sum.problem("%v (table %d): %d DDLs delivered, %d scheduled; DDL %d (%q@%v) is at or below checkpoint %v",
				d.id, d.table, n, len(wantDDLs), n, wantDDLs[n].Query, wantDDLs[n].CommitTs, w.certified)
			return
		}
		sum.UndeliveredDDLs += len(wantDDLs) - n
	}
}

// diffRows counts rows the upstream produced that are missing (at or below
// w.certified) or undelivered (above it), and rows delivered that the
// upstream never produced (or that differ).
func diffRows(sum *Summary, d dispatcherRef, want, got []common.Row, w window) {
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
			countAbsent(sum, d, &want[i], w)
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

// countAbsent counts an upstream row its sink does not hold: missing if
// its checkpoint certified it, undelivered otherwise.
func countAbsent(sum *Summary, d dispatcherRef, r *common.Row, w window) {
	if r.CommitTs > w.certified {
		sum.UndeliveredRows++
		return
	}
	sum.MissingRows++
	sum.problem("%v (table %d): row %x@%v missing (at or below checkpoint %v)", d.id, d.table, r.Key, r.CommitTs, w.certified)
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
func (s *server) verifyDurable(sum *Summary, sink *pebblesink.Sink, d dispatcherRef, final common.Ts, behind bool, want []common.Row, wantDDLs []schemastore.DDL) {
	if sink == nil {
		sum.SinkErrors++
		sum.problem("%v (table %d): its collector's sink could not be read", d.id, d.table)
		return
	}
	ckpt, err := sink.CheckpointOf(d.id)
	if err != nil {
		sum.SinkErrors++
		sum.problem("%v: read checkpoint: %v", d.id, err)
		return
	}
	w := s.judge(sum, d, final, max(ckpt, d.startTs), behind)
	versions, err := sink.Versions(d.table)
	if err != nil {
		sum.SinkErrors++
		sum.problem("%v: read sink: %v", d.id, err)
		return
	}
	verifyVersions(sum, d, want, versions, w)
	got, err := sink.DDLs(d.table)
	if err != nil {
		sum.SinkErrors++
		sum.problem("%v: read DDLs: %v", d.id, err)
		return
	}
	// The sink holds DDLs up to its checkpoint, which may pass final after
	// an interruption; compare the scheduled range only.
	got = slices.DeleteFunc(got, func(dl messaging.DDL) bool { return dl.CommitTs > final })
	sum.DDLsDelivered += len(got)
	compareDDLs(sum, d, got, wantDDLs, w)
}

// verifyVersions compares stored versions with the upstream's rows of the
// whole workload for one table; absent rows are missing or undelivered by
// w (countAbsent).
func verifyVersions(sum *Summary, d dispatcherRef, want []common.Row, versions []pebblesink.Version, w window) {
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
	byKeyThenTs := func(a, b pebblesink.Version) int {
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
	for i := range want {
		// In want's order, so the problems name the earliest; marked seen
		// so that a row listed twice is counted once, as in wantSet.
		if k := (vk{string(want[i].Key), want[i].CommitTs}); !seen[k] {
			countAbsent(sum, d, &want[i], w)
			seen[k] = true
		}
	}
}

// writeSummary prints the summary: one JSON object, or text.
func writeSummary(w io.Writer, asJSON bool, s Summary) error {
	if asJSON {
		enc := json.NewEncoder(w)
		return enc.Encode(s)
	}
	verdict := verdictLine(s)
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
	if !s.Drained {
		if _, err := fmt.Fprintf(w, "  not drained        %d dispatchers behind at the drain deadline; undelivered %d rows, %d DDLs; slowest lag %.1f ms: %s\n",
			s.BehindDispatchers, s.UndeliveredRows, s.UndeliveredDDLs, s.SlowestLagMs, s.SlowestDispatcher); err != nil {
			return err
		}
	}
	for _, p := range s.Problems {
		if _, err := fmt.Fprintf(w, "  problem: %s\n", p); err != nil {
			return err
		}
	}
	return nil
}

// verdictLine is the summary's first line. A run that did not drain says
// so with its extent, whether or not it also failed: "lost wakeup" and
// "missing" are only what a run proves lost, never what was merely late.
func verdictLine(s Summary) string {
	notDrained := fmt.Sprintf("NOT DRAINED: %d of %d dispatchers behind the upstream's final resolved-ts at the drain deadline, %d rows undelivered, slowest lag %.1f ms",
		s.BehindDispatchers, s.Dispatchers, s.UndeliveredRows, s.SlowestLagMs)
	switch decideVerdict(s.Drained, s.violations()) {
	case VerdictVerified:
		return "VERIFIED"
	case VerdictNotDrained:
		return notDrained + "; nothing delivered contradicts the upstream"
	}
	if !s.Drained {
		return "VERIFICATION FAILED (and " + notDrained + ")"
	}
	return "VERIFICATION FAILED"
}

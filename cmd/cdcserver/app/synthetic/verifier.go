// The verifier: once the run has stopped, it compares what each
// dispatcher's sink holds with what the upstream produced (the generator's
// Rows and the DDL schedule are the oracle), dispatcher by dispatcher, and
// fills the Summary (verify).

package synthetic

import (
	"bytes"
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/pebblesink"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

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

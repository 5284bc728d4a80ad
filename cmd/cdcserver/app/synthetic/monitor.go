// The monitor: while the run goes on it samples progress (the lag, the
// pending tasks, the progress line), tells when the warm-up ended and when
// every dispatcher caught up with the upstream's end, and gives up at the
// drain deadline (monitor); before the parts stop it describes the
// dispatchers still behind (diagnose).

package synthetic

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/cdcflow/eventservice/internal/latency"
	"github.com/cdcflow/eventservice/pkg/common"
)

// runResult is what the monitor observed.
type runResult struct {
	elapsed     time.Duration // from start to delivery complete (or stop)
	interrupted bool          // ctx was cancelled (Ctrl-C)
	complete    bool          // every dispatcher reached the upstream's end
	lag         latency.Histogram
	peakPending int
	peakPrepare int
	peakScan    int
	lastApplied uint64
	// lagCursor is where recordLag continues; worst is the largest lag
	// of its sweeps (what the progress line shows until the upstream
	// ends).
	lagCursor int
	worst     sweepWorst
	// behind lists the dispatchers not yet seen caught up (indexes into
	// feeds and their ds), built at the first check after the upstream
	// ended; each check visits only them, so the drain costs what is left.
	behind behindList
	// warm is set once every dispatcher's checkpoint passed liveFrom (it
	// caught up with what the upstream produced while dispatchers were
	// being registered), after warmup; lag is recorded from then on.
	warm       bool
	warmup     time.Duration
	warmBehind behindList
	// late holds the dispatchers that had not reached their final target
	// at the drain deadline, with what they had then; empty when the run
	// drained (complete).
	late map[common.DispatcherID]lateAt
}

// lateAt is a dispatcher behind at the drain deadline: its table and the
// checkpoint it had then (its start-ts if it could not be read, being
// moved).
type lateAt struct {
	table int64
	ckpt  common.Ts
}

// behindList is a shrinking list of dispatchers not yet caught up with a
// target; sweepBehind visits at most budget of them per call, from a
// cursor, so a sample costs a bounded number of collector lookups.
type behindList struct {
	refs   []behindRef
	built  bool
	cursor int
	// minCkpt is the minimum checkpoint seen in the current pass.
	minCkpt common.Ts
	// budget is how many the next call visits (nextSweep).
	budget int
}

// maxSweep bounds the dispatchers one sweepBehind call looks at: a million
// are covered in two seconds, at half a million lookups a second.
// minSweep is the least it looks at.
const (
	maxSweep = 50_000
	minSweep = 5_000
)

// nextSweep is the budget of the call after one that dropped dropped
// dispatchers: twice that, within [minSweep, maxSweep]. A lookup of a cold
// dispatcher among a million is a cache miss or more, so sweeping at the
// full rate while almost nobody is caught up (a million-table warm-up)
// takes a core's share from the system it measures; the sweep instead
// costs in proportion to the dispatchers that catch up, and returns to
// full speed within a few samples once they do.
func nextSweep(dropped int) int {
	return min(maxSweep, max(minSweep, 2*dropped))
}

type behindRef struct{ feed, ds int }

const sampleEvery = 100 * time.Millisecond

// nextSample is the wait before the next sample: sampleEvery, give or
// take up to half of it at random. A sampler of a fixed period is in
// phase with the upstream's resolved-ts cadence (the generator publishes
// on the wall clock's 10 ms boundaries, and 100 ms is ten of them), so it
// would read each dispatcher's lag at the same point of the cadence every
// time, and the quantiles would show that point instead of the spread.
func nextSample(rng *rand.Rand) time.Duration {
	return sampleEvery/2 + time.Duration(rng.Int64N(int64(sampleEvery)))
}

// monitor samples progress until the workload is delivered, ctx is
// cancelled, or delivery stalls for DrainTimeout after the upstream ended.
// After a cancellation it freezes the upstream and gives delivery
// DrainTimeout to catch up with what was produced.
func (s *server) monitor(ctx context.Context, stderr io.Writer) *runResult {
	r := &runResult{}
	start := time.Now()
	rng := rand.New(rand.NewPCG(uint64(start.UnixNano()), 0))
	tick := time.NewTimer(nextSample(rng))
	defer tick.Stop()
	var lastPrint time.Time
	var lastRows, lastBytes uint64
	var drainDeadline time.Time
	// minCkpt and caughtUp are the last check's (checkBehind).
	var minCkpt common.Ts
	var caughtUp bool
	for {
		select {
		case <-tick.C:
			tick.Reset(nextSample(rng))
		case <-ctx.Done():
			if !r.interrupted {
				r.interrupted = true
				s.gen.Close() // freeze the upstream; deliver what it produced
				drainDeadline = time.Now().Add(s.cfg.DrainTimeout)
				fmt.Fprintln(stderr, "interrupted: stopping the upstream and draining delivery")
			}
			ctx = context.Background() // a second signal is handled by the caller's context
			continue
		}
		now := time.Now()
		p := s.svc.Progress()
		r.peakPrepare = max(r.peakPrepare, p.PendingPrepare)
		r.peakScan = max(r.peakScan, p.PendingScan)
		r.peakPending = max(r.peakPending, p.PendingPrepare+p.PendingScan)
		frontier := s.gen.ResolvedTs()
		upstreamDone := frontier >= s.meta.EndTs || r.interrupted
		switch {
		case !upstreamDone && !r.warm:
			// Catching up with the rows produced during registration: the
			// steady state, whose lag is recorded, starts after it.
			if s.warm != nil {
				if at, ok := s.warm.done(); ok {
					// From the upstream's start, which the sweep below
					// can only approximate by the monitor's.
					r.warm, r.warmup = true, max(0, at.Sub(s.liveAt))
				}
				break
			}
			var warm bool
			minCkpt, warm = s.sweepBehind(&r.warmBehind, func(dispatcherRef) common.Ts { return s.liveFrom })
			if warm {
				r.warm, r.warmup = true, now.Sub(start)
			}
		case !upstreamDone:
			s.recordLag(r, now)
			if lag, ok := r.worst.last(); ok {
				minCkpt = common.TsFromTime(now.Add(-lag)) // shown as that lag
			}
		default:
			// No dispatcher can be caught up before the upstream ends.
			minCkpt, caughtUp = s.sweepBehind(&r.behind, func(d dispatcherRef) common.Ts { return s.finalTarget(r, d) })
		}
		if upstreamDone && drainDeadline.IsZero() {
			drainDeadline = now.Add(s.cfg.DrainTimeout)
		}
		if s.cfg.ProgressInterval > 0 && now.Sub(lastPrint) >= s.cfg.ProgressInterval {
			applied := s.rowsApplied()
			dt := now.Sub(lastPrint).Seconds()
			if lastPrint.IsZero() {
				dt = now.Sub(start).Seconds()
			}
			fmt.Fprintf(stderr, "%5.1fs/%v  rows/s %8.0f  MB/s %6.2f  lag p50 %4dms p99 %5dms  pending prepare %5d scan %3d  coalesced %4.1f%%  resets %d  min-checkpoint lag %s\n",
				now.Sub(start).Seconds(), s.cfg.Duration, float64(applied-lastRows)/dt, float64(p.ScannedBytes-lastBytes)/dt/1e6,
				r.lag.Quantile(0.5).Milliseconds(), r.lag.Quantile(0.99).Milliseconds(), p.PendingPrepare, p.PendingScan,
				100*ratio(p.Coalesced, p.Notifications), s.resets(), lagString(minCkpt, now))
			lastPrint, lastRows, lastBytes = now, applied, p.ScannedBytes
		}
		if upstreamDone && caughtUp {
			r.complete = true
			r.elapsed = now.Sub(start)
			r.lastApplied = s.rowsApplied()
			return r
		}
		if !drainDeadline.IsZero() && now.After(drainDeadline) {
			r.late = s.lateAtDeadline(r)
			// Those that caught up since the last sample did drain.
			r.complete = len(r.late) == 0
			if !r.complete {
				fmt.Fprintf(stderr, "drain timeout: %d dispatchers had not reached the upstream's final resolved-ts\n", len(r.late))
			}
			r.elapsed = now.Sub(start)
			r.lastApplied = s.rowsApplied()
			return r
		}
	}
}

// maxLagSamples bounds the dispatchers whose lag one sample records: beyond
// it the lag is sampled round-robin (a sweep of a million dispatchers takes
// ten seconds), so the monitor's cost per sample stays bounded whatever
// the number of dispatchers: 100k lookups a second at most, 256 under each
// lock of a collector (Collector.Checkpoints).
const maxLagSamples = 10_000

// recordLag records the resolved-ts lag of up to maxLagSamples
// dispatchers, continuing round-robin from where the last sample stopped,
// and the largest lag of each complete sweep.
func (s *server) recordLag(r *runResult, now time.Time) {
	total := len(s.feeds) * s.cfg.Tables
	for left := min(total, maxLagSamples); left > 0; {
		f := s.feeds[r.lagCursor/s.cfg.Tables]
		first := r.lagCursor % s.cfg.Tables
		ds := f.ds[first : first+min(left, lookupChunk, s.cfg.Tables-first)]
		left -= len(ds)
		ckpts, known := s.lookup.of(s, f, len(ds), func(i int) dispatcherRef { return ds[i] })
		for i := range ds {
			if ckpt := ckpts[i]; known[i] {
				lag := ckpt.Lag(now)
				r.lag.Record(lag)
				r.worst.note(lag)
			}
			if r.lagCursor = (r.lagCursor + 1) % total; r.lagCursor == 0 {
				r.worst.wrap()
			}
		}
	}
}

// sweepWorst is the largest lag of a round-robin sweep over the
// dispatchers, each dispatcher's lag taken at its own sample. Not the
// sweep's minimum checkpoint: at a million dispatchers a sweep takes ten
// seconds, and its first checkpoint, aged by the rest of the sweep and the
// next, reads as far more behind than any dispatcher is.
type sweepWorst struct {
	cur, done time.Duration
	swept     bool // a sweep completed: done is its worst
}

// note records one dispatcher's lag in the current sweep.
func (w *sweepWorst) note(lag time.Duration) { w.cur = max(w.cur, lag) }

// wrap ends the current sweep.
func (w *sweepWorst) wrap() { w.done, w.cur, w.swept = w.cur, 0, true }

// last returns the worst lag of the last complete sweep, if any.
func (w *sweepWorst) last() (time.Duration, bool) { return w.done, w.swept }

// lookupChunk is how many dispatchers' checkpoints one lookup reads: one
// collector lock per chunk, held for a few hundred map probes.
const lookupChunk = 256

// checkpointLookup reads the checkpoints of a chunk of one feed's
// dispatchers at a time, with its buffers kept from one call to the next
// (the monitor's goroutine only).
type checkpointLookup struct {
	ids   []common.DispatcherID
	ckpts []common.Ts
	known []bool
}

// of returns the checkpoints of the n dispatchers ref(0..n-1) of f and
// whether each is known (checkpointOf without an error); the slices are
// valid until the next call.
func (l *checkpointLookup) of(s *server, f *feed, n int, ref func(int) dispatcherRef) ([]common.Ts, []bool) {
	l.ckpts, l.known = slices.Grow(l.ckpts[:0], n)[:n], slices.Grow(l.known[:0], n)[:n]
	if f.coll == nil {
		for i := range n {
			ckpt, err := s.checkpointOf(f, ref(i))
			l.ckpts[i], l.known[i] = ckpt, err == nil
		}
		return l.ckpts, l.known
	}
	l.ids = slices.Grow(l.ids[:0], n)[:n]
	for i := range n {
		l.ids[i] = ref(i).id
	}
	f.coll.Checkpoints(l.ids, l.ckpts, l.known)
	return l.ckpts, l.known
}

// sweepBehind visits up to l.budget dispatchers of l (all of them are in
// it at first), continuing where the last call stopped, and drops those
// whose checkpoint reached target. It reports the minimum checkpoint seen
// in the current pass over the list and whether the list is empty.
func (s *server) sweepBehind(l *behindList, target func(dispatcherRef) common.Ts) (common.Ts, bool) {
	if !l.built {
		l.built = true
		n := 0
		for _, f := range s.feeds {
			n += len(f.ds)
		}
		l.refs = make([]behindRef, 0, n) // once, not grown a million entries at a time
		for fi, f := range s.feeds {
			for di := range f.ds {
				l.refs = append(l.refs, behindRef{feed: fi, ds: di})
			}
		}
	}
	if l.cursor >= len(l.refs) {
		l.cursor, l.minCkpt = 0, 0
	}
	if l.budget == 0 {
		l.budget = maxSweep
	}
	end := min(len(l.refs), l.cursor+l.budget)
	kept := l.cursor
	for i := l.cursor; i < end; {
		// A chunk of refs of one feed (the list is in feed order).
		j := i + 1
		for j < end && j-i < lookupChunk && l.refs[j].feed == l.refs[i].feed {
			j++
		}
		chunk := l.refs[i:j]
		f := s.feeds[chunk[0].feed]
		ckpts, known := s.lookup.of(s, f, len(chunk), func(k int) dispatcherRef { return f.ds[chunk[k].ds] })
		for k, ref := range chunk {
			d := f.ds[ref.ds]
			if ckpts[k] >= target(d) && known[k] {
				continue // caught up: dropped
			}
			// Behind, or being moved (look again next time).
			l.refs[kept] = ref
			kept++
			if known[k] && (l.minCkpt == 0 || ckpts[k] < l.minCkpt) {
				l.minCkpt = ckpts[k]
			}
		}
		i = j
	}
	l.budget = nextSweep(end - kept)
	l.refs = append(l.refs[:kept], l.refs[end:]...)
	l.cursor = kept
	return l.minCkpt, len(l.refs) == 0
}

// lateAtDeadline looks once at every dispatcher still on the list of those
// behind (the others had caught up) and returns those below their final
// target, with their checkpoint. It costs what is left behind, once.
func (s *server) lateAtDeadline(r *runResult) map[common.DispatcherID]lateAt {
	late := map[common.DispatcherID]lateAt{}
	for _, ref := range r.behind.refs {
		f := s.feeds[ref.feed]
		d := f.ds[ref.ds]
		ckpt, err := s.checkpointOf(f, d)
		if err != nil {
			ckpt = d.startTs // being moved: no better lower bound
		}
		if err != nil || ckpt < s.finalTarget(r, d) {
			late[d.id] = lateAt{table: d.table, ckpt: max(ckpt, d.startTs)}
		}
	}
	return late
}

// finalTarget is the resolved-ts delivery must reach for d: the workload's
// end, or after an interruption what the store had committed.
func (s *server) finalTarget(r *runResult, d dispatcherRef) common.Ts {
	if r.interrupted {
		if ds, err := s.store.Dispatcher(d.id); err == nil {
			return ds.ResolvedTs
		}
	}
	return s.meta.EndTs
}

// finalTargets captures, per dispatcher, the resolved-ts delivery must
// have reached: the workload's end, or after an interruption what the
// store had committed when delivery stopped.
func (s *server) finalTargets(r *runResult) map[common.DispatcherID]common.Ts {
	out := map[common.DispatcherID]common.Ts{}
	for _, f := range s.feeds {
		for _, d := range f.ds {
			out[d.id] = s.finalTarget(r, d)
		}
	}
	return out
}

// checkpointOf is d's checkpoint: its collector's, or, with the collector
// in another process, the one the service last heard in a heartbeat
// (behind the collector's by up to one heartbeat interval).
func (s *server) checkpointOf(f *feed, d dispatcherRef) (common.Ts, error) {
	if f.coll != nil {
		st, err := f.coll.Dispatcher(d.id)
		return st.Checkpoint, err
	}
	st, err := s.svc.Inspect(d.id)
	return st.Checkpoint, err
}

// rowsApplied is the rows the sinks accepted so far; with collectors in
// other processes, for the progress line, the rows the service scanned.
func (s *server) rowsApplied() uint64 {
	if s.rs != nil {
		return s.svc.Progress().ScannedRows
	}
	var n uint64
	for _, f := range s.feeds {
		n += f.coll.Counters().RowsApplied
	}
	return n
}

// resets is the collectors' resets so far (the service's count with
// collectors in other processes).
func (s *server) resets() uint64 {
	if s.rs != nil {
		return s.svc.Progress().Resets
	}
	var n uint64
	for _, f := range s.feeds {
		n += f.coll.Counters().TotalResets()
	}
	return n
}

func ratio(a, b uint64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func lagString(ts common.Ts, now time.Time) string {
	if ts == 0 {
		return "-"
	}
	return ts.Lag(now).Truncate(time.Millisecond).String()
}

// diagnose records the collector's and the service's view of the slowest
// dispatcher behind at the drain deadline and of the first maxProblems
// behind their final target (the ones the summary reports, in the same
// order), while both still run: a run where a million lag must not build
// a million descriptions.
func (s *server) diagnose(r *runResult, finals map[common.DispatcherID]common.Ts) {
	s.diag = map[common.DispatcherID]string{}
	slowest, _, haveSlowest := slowestBehind(r.late, finals)
	for _, f := range s.feeds {
		for _, d := range f.ds {
			if len(s.diag) >= maxProblems && !haveSlowest {
				return
			}
			isSlowest := haveSlowest && d.id == slowest
			if isSlowest {
				haveSlowest = false // described even if it caught up since
			}
			ckpt, err := s.checkpointOf(f, d)
			if !isSlowest && (err == nil && ckpt >= finals[d.id] || len(s.diag) >= maxProblems) {
				continue
			}
			var cs any = "in another process"
			if f.coll != nil {
				cs, _ = f.coll.Dispatcher(d.id)
			}
			ss, serr := s.svc.Inspect(d.id)
			ds, _ := s.store.Dispatcher(d.id)
			s.diag[d.id] = fmt.Sprintf("collector %+v (err %v); service %+v (err %v); store %+v", cs, err, ss, serr, ds)
		}
	}
}

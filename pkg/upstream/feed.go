package upstream

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/touchahead"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
)

// scheduleHorizon bounds how far ahead the driver looks for a
// subscription's next tick with rows when it files it for later: a table
// with no rows for that long is looked at again then.
const scheduleHorizon = 1 << 20

// genSub is one subscription to a Generator.
type genSub struct {
	g  *Generator
	id uint64
	// span is packed (a whole table carries no keys: at a million
	// subscriptions the 40 bytes of a common.Span decide a size class).
	span    common.PackedSpan
	startTs common.Ts
	// filter is the span for a partial-table span, nil for a whole table.
	filter *common.Span
	// lo is max(startTs, workload StartTs): rows at or below it are never
	// pushed.
	lo    common.Ts
	guard eventstore.SinkGuard

	// Driver-owned: only the driver goroutine reads or writes these.
	//
	// lastResolved is the last resolved-ts pushed (or lo), for
	// ResolvedInterval (its boundaries are offset by Generator.stagger).
	lastResolved common.Ts
	// cur is the position of the next row to push: row cur.idx of the
	// (filtered) rows of tick cur.tick. It moves only when the sink has
	// accepted everything before it, so a failed push is retried from
	// exactly there, and rows are neither skipped nor repeated.
	cur cursor
	// cache holds the filtered rows of tick cacheTick (noCacheTick: none),
	// so a tick split across chunks is generated once.
	cache     []common.Row
	cacheTick int64
	// memo answers the driver's questions about the table's next tick with
	// rows (workload.nextTickMemo).
	memo tickMemo

	// Progress, read by Stats without a lock.
	resolved   atomic.Uint64 // last resolved-ts the sink accepted
	rowsPushed atomic.Uint64
	batches    atomic.Uint64
	pushErrors atomic.Uint64
	sinkClosed atomic.Bool
}

type cursor struct {
	tick int64
	idx  int
}

// Close stops the feed. Once it returns the driver never calls the sink
// again; an in-flight Push is cancelled through its context and waited for.
// Idempotent.
func (s *genSub) Close() {
	if !s.guard.Close() {
		return
	}
	g := s.g
	g.mu.Lock()
	defer g.mu.Unlock()
	g.mu.subs.Remove(s)
}

// run is the driver: on every tick (or kick) it advances the frontier and
// feeds the subscriptions that are due, looping without waiting while a
// catch-up has work left.
func (g *Generator) run() {
	now := g.clock.Now()
	t := g.clock.NewTimer(g.tickBoundaryAfter(now).Sub(now))
	defer t.Stop()
	tg := newTickGen(g.w)
	for {
		passNow := g.feedDue(tg)
		next := g.tickBoundaryAfter(passNow)
		wait := next.Sub(g.clock.Now())
		if k := g.knobs.arming; k != nil {
			k()
		}
		t.Reset(wait)
		// The wait is relative, so a clock that moved between reading it
		// and arming the timer (a preempted driver; a fake clock advanced
		// by a test in that gap) armed it that much past the boundary: a
		// fake clock then never fires it, and a real one fires it late.
		// Read the clock again now that the timer runs: a boundary already
		// passed goes at once, and any later move of the clock fires the
		// timer. A stale tick the timer leaves behind costs one idle pass.
		if !g.clock.Now().Before(next) {
			continue
		}
		select {
		case <-g.ctx.Done():
			return
		case <-t.C():
		case <-g.kick:
		}
	}
}

// tickBoundaryAfter is the first tick boundary of the wall clock after
// passNow, when the frontier can next move (the driver waits until then;
// one already passed: it goes at once). A pass waits for the boundary
// itself rather than for a ticker of its own phase: a ticker started between two
// boundaries fires up to a whole tick after each one, and every
// resolved-ts it publishes is that much older than it could be (the
// resolved-ts lag of the 10 ms default carried a random 0-10 ms of it per
// run). The boundary is the one after the time the pass read, not after
// the pass's end: a boundary crossed during a long pass is not skipped.
func (g *Generator) tickBoundaryAfter(passNow time.Time) time.Time {
	tick := g.w.tickMs
	ms := passNow.UnixMilli()
	next := (ms/tick + 1) * tick
	if ms < 0 && ms%tick != 0 { // division truncates towards zero
		next -= tick
	}
	return time.UnixMilli(next)
}

// feedDue advances the frontier, moves the subscriptions whose due tick has
// elapsed (and new ones) to the ready list, and feeds the ready list in
// rounds: each round gives each ready subscription one bounded chunk, so a
// catch-up does not starve the others. A subscription that is done until a
// later tick is filed in that tick's bucket, so a pass costs what is due,
// not the number of subscriptions.
func (g *Generator) feedDue(tg *tickGen) (passNow time.Time) {
	f, passNow := g.advanceFrontier()
	last := g.w.tickOf(f)
	g.mu.Lock()
	added := g.mu.added
	g.mu.added = nil
	g.mu.Unlock()
	sc := &g.sched
	if f > sc.announced {
		sc.announced = f
		if g.opts.OnFrontier != nil {
			g.opts.OnFrontier(f)
		}
	}
	sc.ready = append(sc.ready, added...)
	sc.ready = append(sc.ready, sc.retry...)
	clear(sc.retry)
	sc.retry = sc.retry[:0]
	if last > sc.done {
		if last-sc.done <= int64(len(sc.buckets)) {
			for k := sc.done + 1; k <= last; k++ {
				sc.takeBucket(k)
			}
		} else { // a long jump (catch-up from far back): visit the buckets, not the ticks
			for k := range sc.buckets {
				if k <= last {
					sc.takeBucket(k)
				}
			}
		}
		sc.done = last
	}
	for {
		round := sc.ready
		sc.ready = sc.spare[:0]
		for i, s := range round {
			if i%touchahead.Chunk == 0 {
				sc.touch(round[i:min(i+touchahead.Chunk, len(round))])
			}
			if g.ctx.Err() != nil {
				return passNow
			}
			if r := g.feed(s, f, tg); r != feedAdvance {
				g.schedule(s, r, last)
			} else if len(sc.adv) >= maxAdvanceBatch {
				g.flushAdvances(f, last)
			}
		}
		g.flushAdvances(f, last)
		clear(round)
		sc.spare = round
		if k := g.knobs.pass; k != nil {
			k(passInfo{frontier: f, more: len(sc.ready) > 0})
		}
		if len(sc.ready) == 0 {
			return passNow
		}
	}
}

// takeBucket moves the subscriptions filed under tick k to the ready list.
func (sc *schedule) takeBucket(k int64) {
	if b, ok := sc.buckets[k]; ok {
		sc.ready = append(sc.ready, b...)
		delete(sc.buckets, k)
		if len(sc.free) < maxFreeBuckets {
			clear(b) // no stale pointers kept alive by the spare
			sc.free = append(sc.free, b[:0])
		}
	}
}

// maxFreeBuckets bounds the emptied bucket slices kept: a resolved
// interval's worth of ticks is what a steady run refiles into.
const maxFreeBuckets = 1024

// file adds s to the bucket of tick due, reusing an emptied slice for a
// new bucket.
func (sc *schedule) file(due int64, s *genSub) {
	b, ok := sc.buckets[due]
	if !ok && len(sc.free) > 0 {
		b = sc.free[len(sc.free)-1]
		sc.free[len(sc.free)-1] = nil
		sc.free = sc.free[:len(sc.free)-1]
	}
	sc.buckets[due] = append(b, s)
}

// feedResult is what feed leaves a subscription waiting for.
type feedResult int

const (
	// feedMore: work is left below the frontier; feed again next round.
	feedMore feedResult = iota
	// feedWait: everything below the frontier is pushed; wait for the next
	// tick with rows or the next resolved-ts boundary.
	feedWait
	// feedRetry: the push failed; retry on the next pass (sc.retry).
	feedRetry
	// feedStop: the subscription or its sink is closed; drop it.
	feedStop
	// feedAdvance: only a resolved-ts advance is due; it waits in the
	// round's list for flushAdvances, which schedules it.
	feedAdvance
)

// maxAdvanceBatch bounds the advances of one PushResolvedGuarded call, so
// the guards held at once and the store's events stay small, and so that a
// call's per-subscription lines (the generator's subscription and guard,
// the store's subscription: about six lines each) stay in the core's
// second-level cache from the call's first pass over them to its last; at
// 4096 they did not, and flushAdvances missed each subscription again
// after the push (docs/benchmarks.md, the steps table).
const maxAdvanceBatch = 512

// pendingAdvance is a subscription whose resolved-ts advance waits for the
// round's PushResolvedGuarded, and the cursor it reaches once that is
// accepted.
type pendingAdvance struct {
	s   *genSub
	cur cursor
}

// flushAdvances pushes the round's pending advances to frontier f in one
// PushResolvedGuarded call (through the scheduler's ResolvedPusher) and
// schedules each subscription by its outcome, as feed does after a push of
// its own.
func (g *Generator) flushAdvances(f common.Ts, last int64) {
	sc := &g.sched
	if len(sc.adv) == 0 {
		return
	}
	guards := sc.advGuards[:0]
	for _, a := range sc.adv {
		guards = append(guards, &a.s.guard)
	}
	errs := sc.advErrs[:0]
	for range guards {
		errs = append(errs, nil)
	}
	if g.pushCtx.Err() != nil && g.ctx.Err() == nil {
		g.pushCtx, g.pushCancel = context.WithCancel(g.ctx)
	}
	sc.pusher.Push(g.pushCtx, g.pushCancel, guards, f, errs)
	accepted := uint64(0) // added to the shared count once, not per advance
	for i, a := range sc.adv {
		s, err := a.s, errs[i]
		r := feedRetry
		switch {
		case err == nil:
			s.cur = a.cur
			s.dropPassedCache()
			s.resolved.Store(uint64(f))
			s.lastResolved = f
			s.batches.Add(1)
			accepted++
			r = feedWait
		case errors.Is(err, eventstore.ErrSubscriptionClosed):
			r = feedStop
		case errors.Is(err, eventstore.ErrClosed):
			s.sinkClosed.Store(true)
			r = feedStop
		case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
			// Another subscription's Close cancels the whole call: only
			// the closed one (or a generator shutting down) stops.
			if g.ctx.Err() != nil || s.guard.IsClosed() {
				r = feedStop
			}
		default:
			s.pushErrors.Add(1)
			g.pushErrors.Add(1)
			g.log.Warn("resolved-ts push failed, will retry",
				zap.Uint64("subscription", s.id), zap.Stringer("span", s.span), zap.Stringer("resolvedTs", f), zap.Error(err))
		}
		g.schedule(s, r, last)
	}
	g.batches.Add(accepted)
	clear(guards)
	clear(errs)
	clear(sc.adv)
	sc.adv, sc.advGuards, sc.advErrs = sc.adv[:0], guards[:0], errs[:0]
}

// schedule files s according to what feed returned; last is the last
// elapsed tick.
func (g *Generator) schedule(s *genSub, r feedResult, last int64) {
	sc := &g.sched
	var due int64
	switch r {
	case feedStop:
		return
	case feedMore:
		sc.ready = append(sc.ready, s)
		return
	case feedRetry:
		sc.retry = append(sc.retry, s)
		return
	case feedWait:
		due = g.nextDue(s, last)
		if due < 0 {
			return // resolved at EndTs: nothing more, ever
		}
	}
	if due <= sc.done {
		sc.ready = append(sc.ready, s)
		return
	}
	sc.file(due, s)
}

// nextDue returns the first tick after last whose end gives s something to
// do: a tick with rows, its next resolved-ts boundary, or the workload's
// end; -1 when s has reached the end.
func (g *Generator) nextDue(s *genSub, last int64) int64 {
	w := g.w
	if common.Ts(s.resolved.Load()) >= w.endTs {
		return -1
	}
	due := last + 1 // ResolvedInterval 0: every tick
	if iv := g.opts.ResolvedInterval.Milliseconds(); iv > 0 {
		// The first tick k whose frontier, (k+1)*tickMs-1 ms, crosses the
		// boundary after the last resolved-ts (see resolvedDue).
		prev := max(s.lastResolved, s.lo).PhysicalMs()
		stagger := g.stagger(s.span.Table(), iv)
		boundary := ((prev+stagger)/iv+1)*iv - stagger // first ms of the next interval
		due = max(due, (boundary+1+w.tickMs-1)/w.tickMs-1)
		limit := min(due-1, last+scheduleHorizon)
		if k, _, ok := w.nextTickMemo(&s.memo, s.span.Table(), max(s.cur.tick, last+1), limit); ok {
			due = k
		}
	}
	return min(due, w.tickOf(w.endTs))
}

// advanceFrontier moves the frontier to the end of the last fully elapsed
// tick (capped at EndTs) and returns it. The frontier never moves back, even
// if the clock does.
func (g *Generator) advanceFrontier() (common.Ts, time.Time) {
	now := g.clock.Now()
	nowMs := now.UnixMilli()
	g.mu.Lock()
	defer g.mu.Unlock()
	if k := nowMs / g.w.tickMs; k > 0 {
		f := min(g.w.tickBase(k)-1, g.w.endTs)
		g.mu.frontier = max(g.mu.frontier, f)
	}
	return g.mu.frontier, now
}

// tickRows returns the rows of tick k this subscription must receive.
func (s *genSub) tickRows(tg *tickGen, k int64) []common.Row {
	if s.cacheTick == k {
		return s.cache
	}
	// Reusing the cache's backing array is safe: batches hold copies of
	// the Row structs, and every tick gets fresh key and value bytes.
	s.cache = s.cache[:0]
	if k, n, ok := s.g.w.nextTickMemo(&s.memo, s.span.Table(), k, k); ok {
		if k := s.g.knobs.tickGenerated; k != nil {
			k()
		}
		s.cache = tg.appendTick(s.cache, s.span.Table(), k, n, s.lo, s.g.w.endTs, s.filter)
	}
	s.cacheTick = k
	s.g.rowsGenerated.Add(uint64(len(s.cache)))
	return s.cache
}

// resolvedDue reports whether s's resolved-ts may advance to f: every tick
// without ResolvedInterval; otherwise once f's physical time crosses the
// next of s's (staggered) interval boundaries, and always at the
// workload's end, so a run can finish.
func (g *Generator) resolvedDue(s *genSub, f common.Ts) bool {
	iv := g.opts.ResolvedInterval.Milliseconds()
	if iv <= 0 || f >= g.w.endTs {
		return true
	}
	last := max(s.lastResolved, s.lo)
	stagger := g.stagger(s.span.Table(), iv)
	return (f.PhysicalMs()+stagger)/iv > (last.PhysicalMs()+stagger)/iv
}

// stagger is the offset in ms of table's resolved-interval boundaries
// (interval iv ms): one phase per group of ResolvedGroupTables tables.
// Computed when needed, not kept per subscription: a hash costs less than
// the eight bytes a million subscriptions would carry.
func (g *Generator) stagger(table, iv int64) int64 {
	return int64(common.Mix64(uint64(table)/uint64(g.opts.ResolvedGroupTables)) % uint64(iv))
}

// noCacheTick marks a subscription's row cache empty (ticks are never
// negative).
const noCacheTick = -1

// dropPassedCache lets go of the row cache once the cursor has left its
// tick: the rows are in the store, and a table's next tick with rows may be
// seconds away. Kept, every table that ever had rows held its last tick's
// rows and their bytes for the rest of the run, growing with the tables
// touched. A tick split across pushes keeps its cache, and a hot table
// allocates one slice a tick, next to the bytes of each of its rows.
func (s *genSub) dropPassedCache() {
	if s.cacheTick != noCacheTick && s.cur.tick != s.cacheTick {
		s.cache, s.cacheTick = nil, noCacheTick
	}
}

// feed pushes the next chunk of s's rows with commit-ts <= f: at most
// PushRowsMax rows, carrying ResolvedTs f if the chunk reaches f and s's
// resolved-ts is due. It only visits ticks with rows.
func (g *Generator) feed(s *genSub, f common.Ts, tg *tickGen) feedResult {
	if s.sinkClosed.Load() || s.guard.IsClosed() {
		return feedStop
	}
	if f <= common.Ts(s.resolved.Load()) {
		return feedWait
	}
	lastTick := g.w.tickOf(f)
	cur := s.cur
	var rows []common.Row
	reached := false
	for {
		if cur.tick > lastTick {
			reached = true
			break
		}
		tr := s.tickRows(tg, cur.tick)
		if cur.idx >= len(tr) {
			k, _, ok := g.w.nextTickMemo(&s.memo, s.span.Table(), cur.tick+1, lastTick)
			if !ok {
				k = lastTick + 1
			}
			cur = cursor{tick: k}
			continue
		}
		if tr[cur.idx].CommitTs > f {
			reached = true
			break
		}
		if len(rows) == g.opts.PushRowsMax {
			break
		}
		rows = append(rows, tr[cur.idx])
		cur.idx++
	}
	advance := reached && g.resolvedDue(s, f)
	if len(rows) == 0 && !advance {
		s.cur = cur // nothing to push until the next resolved boundary
		s.dropPassedCache()
		return feedWait
	}
	if len(rows) == 0 {
		// Only an advance: pushed with the round's others.
		g.sched.adv = append(g.sched.adv, pendingAdvance{s: s, cur: cur})
		return feedAdvance
	}
	b := eventstore.Batch{Rows: rows}
	if advance {
		b.ResolvedTs = f
	}
	if g.pushCtx.Err() != nil && g.ctx.Err() == nil {
		// A Close cancelled the last push's context: take a fresh one.
		g.pushCtx, g.pushCancel = context.WithCancel(g.ctx)
	}
	err := s.guard.Push(g.pushCtx, g.pushCancel, b)
	switch {
	case err == nil:
		s.cur = cur
		s.dropPassedCache()
		if advance {
			s.resolved.Store(uint64(f))
			s.lastResolved = f
		}
		s.rowsPushed.Add(uint64(len(rows)))
		s.batches.Add(1)
		g.rowsPushed.Add(uint64(len(rows)))
		g.batches.Add(1)
		if reached {
			return feedWait
		}
		return feedMore
	case errors.Is(err, eventstore.ErrSubscriptionClosed):
		return feedStop
	case errors.Is(err, eventstore.ErrClosed):
		// The store is closing for good: stop feeding this sink.
		s.sinkClosed.Store(true)
		g.log.Debug("sink closed, feed stopped", zap.Uint64("subscription", s.id), zap.Stringer("span", s.span))
		return feedStop
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return feedStop
	default:
		// Retry from s.cur on the next tick. Drop the cache: the sink may
		// own rows of the failed batch now, so the retry gets fresh bytes.
		s.cacheTick = noCacheTick
		s.pushErrors.Add(1)
		g.pushErrors.Add(1)
		g.log.Warn("push failed, will retry",
			zap.Uint64("subscription", s.id), zap.Stringer("span", s.span),
			zap.Stringer("resolvedTs", common.Ts(s.resolved.Load())), zap.Int("rows", len(rows)), zap.Error(err))
		return feedRetry
	}
}

// SlotKey is s's key in the generator's index (slots.Keyed).
func (s *genSub) SlotKey() subKey { return subKey(s.id) }

// subKey is a subscription's ID as the generator's index's key.
type subKey uint64

// SeededHash hashes k under seed (slots.Key).
func (k subKey) SeededHash(seed uint64) uint64 { return common.Mix64(uint64(k) ^ seed) }

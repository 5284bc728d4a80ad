package upstream

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
)

// maxTicksPerPass bounds how many ticks one subscription may scan in one
// driver pass, so a catch-up over a long, sparse range (mostly empty ticks)
// does not starve the other subscriptions. Rows are bounded by PushRowsMax.
const maxTicksPerPass = 1 << 14

// genSub is one subscription to a Generator.
type genSub struct {
	g       *Generator
	id      uint64
	span    common.Span
	startTs common.Ts
	// filter is &span for a partial-table span, nil for a whole table.
	filter *common.Span
	// lo is max(startTs, workload StartTs): rows at or below it are never
	// pushed.
	lo    common.Ts
	guard *sinkGuard

	// Driver-owned: only the driver goroutine reads or writes these.
	//
	// lastResolved is the last resolved-ts pushed (or lo), for
	// ResolvedInterval; stagger is the subscription's offset of its
	// interval boundaries, in ms.
	lastResolved common.Ts
	stagger      int64
	// cur is the position of the next row to push: row cur.idx of the
	// (filtered) rows of tick cur.tick. It moves only when the sink has
	// accepted everything before it, so a failed push is retried from
	// exactly there, and rows are neither skipped nor repeated.
	cur cursor
	// cache holds the filtered rows of tick cacheTick (if cacheOK), so a
	// tick split across chunks is generated once.
	cache     []common.Row
	cacheTick int64
	cacheOK   bool

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
	if !s.guard.close() {
		return
	}
	g := s.g
	g.mu.Lock()
	defer g.mu.Unlock()
	g.mu.subs = slices.DeleteFunc(g.mu.subs, func(o *genSub) bool { return o == s })
}

// run is the driver: on every tick (or kick) it advances the frontier and
// feeds every subscription, looping without waiting while a catch-up has
// work left.
func (g *Generator) run() {
	t := g.clock.NewTicker(g.opts.Tick)
	defer t.Stop()
	tg := newTickGen(g.w)
	for {
		for {
			info := g.pass(tg)
			if g.passHookForTesting != nil {
				g.passHookForTesting(info)
			}
			if !info.more || g.ctx.Err() != nil {
				break
			}
		}
		select {
		case <-g.ctx.Done():
			return
		case <-t.C():
		case <-g.kick:
		}
	}
}

// pass advances the frontier and gives every live subscription one bounded
// slice of work, in creation order.
func (g *Generator) pass(tg *tickGen) passInfo {
	f := g.advanceFrontier()
	g.mu.Lock()
	subs := slices.Clone(g.mu.subs)
	g.mu.Unlock()
	info := passInfo{frontier: f}
	for _, s := range subs {
		if g.ctx.Err() != nil {
			return info
		}
		if g.feed(s, f, tg) {
			info.more = true
		}
	}
	return info
}

// advanceFrontier moves the frontier to the end of the last fully elapsed
// tick (capped at EndTs) and returns it. The frontier never moves back, even
// if the clock does.
func (g *Generator) advanceFrontier() common.Ts {
	nowMs := g.clock.Now().UnixMilli()
	g.mu.Lock()
	defer g.mu.Unlock()
	if k := nowMs / g.w.tickMs; k > 0 {
		f := min(g.w.tickBase(k)-1, g.w.endTs)
		g.mu.frontier = max(g.mu.frontier, f)
	}
	return g.mu.frontier
}

// tickRows returns the rows of tick k this subscription must receive.
func (s *genSub) tickRows(tg *tickGen, k int64) []common.Row {
	if s.cacheOK && s.cacheTick == k {
		return s.cache
	}
	// Reusing the cache's backing array is safe: batches hold copies of
	// the Row structs, and every tick gets fresh key and value bytes.
	s.cache = tg.appendTick(s.cache[:0], s.span.TableID, k, s.lo, s.g.w.endTs, s.filter)
	s.cacheTick, s.cacheOK = k, true
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
	return (f.PhysicalMs()+s.stagger)/iv > (last.PhysicalMs()+s.stagger)/iv
}

// feed pushes the next chunk of s's rows with commit-ts <= f: at most
// PushRowsMax rows, carrying ResolvedTs f if the chunk reaches f. It reports
// whether s has work left below f that the next pass can do right away.
func (g *Generator) feed(s *genSub, f common.Ts, tg *tickGen) (more bool) {
	if s.sinkClosed.Load() || f <= common.Ts(s.resolved.Load()) {
		return false
	}
	lastTick := g.w.tickOf(f)
	cur := s.cur
	var rows []common.Row
	reached := false
	for scanned := 0; ; {
		if cur.tick > lastTick {
			reached = true
			break
		}
		tr := s.tickRows(tg, cur.tick)
		if cur.idx >= len(tr) {
			cur = cursor{tick: cur.tick + 1}
			if scanned++; scanned >= maxTicksPerPass {
				break
			}
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
	if len(rows) == 0 && !reached {
		// Only empty ticks were scanned: nothing to push, nothing skipped.
		s.cur = cur
		return true
	}
	advance := reached && g.resolvedDue(s, f)
	if len(rows) == 0 && !advance {
		s.cur = cur // nothing to push until the next resolved boundary
		return false
	}
	b := eventstore.Batch{Rows: rows}
	if advance {
		b.ResolvedTs = f
	}
	err := s.guard.push(nil, b)
	switch {
	case err == nil:
		s.cur = cur
		if advance {
			s.resolved.Store(uint64(f))
			s.lastResolved = f
		}
		s.rowsPushed.Add(uint64(len(rows)))
		s.batches.Add(1)
		g.rowsPushed.Add(uint64(len(rows)))
		g.batches.Add(1)
		return !reached
	case errors.Is(err, errSubscriptionClosed):
		return false
	case errors.Is(err, eventstore.ErrClosed):
		// The store is closing for good: stop feeding this sink.
		s.sinkClosed.Store(true)
		g.log.Debug("sink closed, feed stopped", zap.Uint64("subscription", s.id), zap.Stringer("span", s.span))
		return false
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return false
	default:
		// Retry from s.cur on the next tick. Drop the cache: the sink may
		// own rows of the failed batch now, so the retry gets fresh bytes.
		s.cacheOK = false
		s.pushErrors.Add(1)
		g.pushErrors.Add(1)
		g.log.Warn("push failed, will retry",
			zap.Uint64("subscription", s.id), zap.Stringer("span", s.span),
			zap.Stringer("resolvedTs", common.Ts(s.resolved.Load())), zap.Int("rows", len(rows)), zap.Error(err))
		return false
	}
}

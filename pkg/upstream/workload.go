package upstream

import (
	"encoding/binary"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"

	"github.com/cdcflow/eventservice/pkg/common"
)

// deletePercent is the share of rows that are deletes; the rest are puts
// (inserts or updates, depending on whether the key was written before).
const deletePercent = 10

// Salts separate the independent draws derived from one tick hash.
const (
	saltSeed  = 0x9e3779b97f4a7c15
	saltCount = 0xd1b54a32d192ed03
	saltPCG   = 0x8cb92ba72f3d8dd7
	saltBlock = 0x2545f4914f6cdd1d
	saltGap   = 0xa0761d6478bd642f
)

// maxBlockTicks caps the block length of a sparse table (see tableClass).
// At the default 10 ms tick it is about 11 minutes.
const maxBlockTicks = 1 << 16

// tableClass is what the row function needs to know about a table's rate.
type tableClass struct {
	// txns is the expected number of transactions per tick.
	txns float64
	// Sparse tables (txns < 1) write one transaction in a tick with
	// probability txns. Their ticks with rows are drawn block by block:
	// block b holds ticks [b*block, (b+1)*block), and a walk of geometric
	// gaps seeded by (Seed, table, b) lists the ticks of b that have rows.
	// The gaps of a Bernoulli process are geometric and memoryless, so
	// this is exactly the per-tick coin flip, but finding the next tick
	// with rows costs O(1 + blocks skipped) instead of O(ticks skipped).
	// block is ceil(1/txns) (capped), so a block holds about one
	// transaction and a random access walks about one gap.
	sparse bool
	block  int64
	logQ   float64 // log(1 - txns), the denominator of a geometric draw
}

func newTableClass(txns float64) tableClass {
	c := tableClass{txns: txns}
	if txns > 0 && txns < 1 {
		c.sparse = true
		c.block = min(int64(math.Ceil(1/txns)), maxBlockTicks)
		c.logQ = math.Log1p(-txns)
	}
	return c
}

// workload is the immutable description of the synthetic data: the row
// function of the determinism contract. It holds no state, so any number of
// goroutines may generate from it at once (each with its own tickGen).
type workload struct {
	seed            uint64
	tables          int64
	hotTables       int64
	txnRows         int
	rowBytes        int
	keysPerTable    uint64
	txnsPerCommitTs int
	tickMs          int64
	// hot and cold describe the rate of one hot or one cold table. Equal
	// when the workload is uniform.
	hot, cold tableClass
	// startTs and endTs bound the workload: rows have commit-ts in
	// (startTs, endTs]; endTs is math.MaxUint64 when unbounded.
	startTs, endTs common.Ts
}

// newWorkload derives the row function from defaulted, validated options.
func newWorkload(o GeneratorOptions) *workload {
	w := &workload{
		seed:            o.Seed,
		tables:          int64(o.Tables),
		hotTables:       int64(o.HotTables),
		txnRows:         o.TxnRows,
		rowBytes:        o.RowBytes,
		keysPerTable:    uint64(o.KeysPerTable),
		txnsPerCommitTs: o.TxnsPerCommitTs,
		tickMs:          o.Tick.Milliseconds(),
		startTs:         o.StartTs,
		endTs:           o.EndTs,
	}
	if w.endTs == 0 {
		w.endTs = math.MaxUint64
	}
	txnsPerTick := float64(o.RowsPerSec) * float64(w.tickMs) / 1000 / float64(o.TxnRows)
	if o.HotFraction == 0 || o.HotTables == o.Tables {
		w.hot = newTableClass(txnsPerTick / float64(o.Tables))
		w.cold = w.hot
	} else {
		w.hot = newTableClass(txnsPerTick * o.HotFraction / float64(o.HotTables))
		w.cold = newTableClass(txnsPerTick * (1 - o.HotFraction) / float64(o.Tables-o.HotTables))
	}
	return w
}

func (w *workload) validTable(table int64) bool { return table >= 1 && table <= w.tables }

// tickOf returns the tick whose timestamps include ts.
func (w *workload) tickOf(ts common.Ts) int64 { return ts.PhysicalMs() / w.tickMs }

// tickBase returns the first timestamp of tick k.
func (w *workload) tickBase(k int64) common.Ts { return common.ComposeTs(k*w.tickMs, 0) }

// clamp intersects (start, end] with the workload's bounds. ok is false when
// the intersection is empty.
func (w *workload) clamp(start, end common.Ts) (lo, hi common.Ts, ok bool) {
	lo, hi = max(start, w.startTs), min(end, w.endTs)
	return lo, hi, lo < hi
}

// tickHash is the root of all randomness of (table, tick). Hashing the
// coordinates, rather than drawing from one shared stream, is what makes a
// tick's rows independent of which other ticks or tables were generated.
func (w *workload) tickHash(table, tick int64) uint64 {
	h := common.Mix64(w.seed ^ saltSeed)
	h = common.Mix64(h + uint64(table))
	return common.Mix64(h + uint64(tick))
}

func (w *workload) class(table int64) *tableClass {
	if table > w.hotTables {
		return &w.cold
	}
	return &w.hot
}

// denseCount returns how many transactions a dense table (txns >= 1)
// writes in the tick whose hash is h: the integer part of the expected
// count plus one with probability equal to its fractional part, so the
// long-run mean is exact.
func denseCount(c *tableClass, h uint64) int {
	n := int(c.txns)
	if frac := c.txns - float64(n); frac > 0 {
		u := float64(common.Mix64(h^saltCount)>>11) * 0x1p-53
		if u < frac {
			n++
		}
	}
	return n
}

// nextTick returns the first tick in [from, limit] in which table writes
// transactions, and how many; ok is false when there is none. Its cost is
// O(1) for a dense table and O(1 + blocks skipped) for a sparse one, which
// is what makes generating and verifying a million mostly idle tables cost
// what their rows cost.
func (w *workload) nextTick(table, from, limit int64) (tick int64, n int, ok bool) {
	if from > limit {
		return 0, 0, false
	}
	c := w.class(table)
	if !c.sparse {
		if c.txns <= 0 {
			return 0, 0, false
		}
		return from, denseCount(c, w.tickHash(table, from)), true
	}
	for b := from / c.block; b*c.block <= limit; b++ {
		if t, found := w.blockTick(table, b, from, c); found {
			if t > limit {
				return 0, 0, false
			}
			return t, 1, true
		}
	}
	return 0, 0, false
}

// tickMemo is one subscription's last answer about its sparse table, so
// that the driver's next questions (is there a row in this tick, in the
// ticks up to the frontier, before the next resolved boundary) are
// answered without walking the table's block again: at a million tables
// each subscription asks three such questions a second about the same
// block, each a few hashes and a logarithm.
//
// next >= 0: the first tick with rows at or after from is next.
// next < 0: no tick in [from, ^next] has rows.
// The zero value knows nothing (a memo that could mean "tick 0 has rows"
// is only ever recomputed).
type tickMemo struct {
	from, next int64
}

// memoReachBlocks is how far past its question a memo's search looks, in
// blocks: a table without rows up to the question then answers the next
// ones (a second later, a resolved interval further) from the memo too.
// A block holds one transaction on average, so the search usually ends in
// the first block or two.
const memoReachBlocks = 4

// nextTickMemo is nextTick for a subscription with memo m: the same
// answer, from m when m covers the question, else from a search it then
// keeps in m.
func (w *workload) nextTickMemo(m *tickMemo, table, from, limit int64) (tick int64, n int, ok bool) {
	c := w.class(table)
	if !c.sparse || from > limit {
		return w.nextTick(table, from, limit)
	}
	if (m.from != 0 || m.next != 0) && from >= m.from {
		if m.next >= 0 && from <= m.next {
			if m.next <= limit {
				return m.next, 1, true
			}
			return 0, 0, false
		}
		if m.next < 0 && limit <= ^m.next {
			return 0, 0, false
		}
	}
	reach := limit
	if ext := from + memoReachBlocks*c.block; ext > limit && ext > from { // ext > from: no overflow
		reach = ext
	}
	t, _, found := w.nextTick(table, from, reach)
	if !found {
		m.from, m.next = from, ^reach
		return 0, 0, false
	}
	m.from, m.next = from, t
	if t > limit {
		return 0, 0, false
	}
	return t, 1, true
}

// blockTick walks the gaps of block b of a sparse table and returns its
// first tick with rows at or after from.
func (w *workload) blockTick(table, b, from int64, c *tableClass) (int64, bool) {
	h := common.Mix64(w.seed ^ saltBlock)
	h = common.Mix64(h + uint64(table))
	h = common.Mix64(h + uint64(b))
	base, end := b*c.block, (b+1)*c.block
	pos := base - 1
	for i := uint64(1); ; i++ {
		u := float64(common.Mix64(h+i*saltGap)>>11) * 0x1p-53 // uniform in [0, 1)
		gap := math.Log1p(-u) / c.logQ                        // geometric: failures before a success
		if gap >= float64(end-pos) {
			return 0, false
		}
		pos += 1 + int64(gap)
		if pos >= end {
			return 0, false
		}
		if pos >= from {
			return pos, true
		}
	}
}

// tickGen generates ticks. It owns reusable scratch and a PRNG that is
// reseeded per tick; not safe for concurrent use.
type tickGen struct {
	w      *workload
	pcg    rand.PCG
	rng    *rand.Rand
	groups []int
	keys   []uint64
	seen   map[uint64]struct{}
	picked []pickedRow
}

func newTickGen(w *workload) *tickGen {
	g := &tickGen{w: w}
	g.rng = rand.New(&g.pcg)
	return g
}

// plan draws the transaction structure of (table, tick): the number of
// transactions n and the sizes of the commit-ts groups. Transaction j
// (0-based) has start-ts base+1+j; group i has commit-ts base+n+1+i. So
// start-ts < commit-ts, both increase within the tick, and everything stays
// inside the tick (Validate guarantees 2n+2 timestamps fit). The group sizes
// are drawn first so RowCount can place commit-ts without generating rows.
func (g *tickGen) plan(table, tick int64, n int) {
	h := g.w.tickHash(table, tick)
	g.groups = g.groups[:0]
	if n == 0 {
		return
	}
	g.pcg.Seed(h, common.Mix64(h^saltPCG))
	for left := n; left > 0; {
		size := 1 + g.rng.IntN(g.w.txnsPerCommitTs)
		size = min(size, left)
		g.groups = append(g.groups, size)
		left -= size
	}
}

// countInRange returns the number of rows of (table, tick), which writes n
// transactions, with commit-ts in (lo, hi].
func (g *tickGen) countInRange(table, tick int64, n int, lo, hi common.Ts) int {
	base := g.w.tickBase(tick)
	if base > lo && base+common.Ts(g.w.tickMs<<common.LogicalBits)-1 <= hi {
		// The whole tick is inside the range: the count alone suffices.
		return n * g.w.txnRows
	}
	g.plan(table, tick, n)
	rows := 0
	for i, size := range g.groups {
		if c := base + common.Ts(n+1+i); c > lo && c <= hi {
			rows += size * g.w.txnRows
		}
	}
	return rows
}

// appendTick appends to dst the rows of (table, tick), which writes n
// transactions, with commit-ts in (lo, hi] and, if span is not nil, key inside span, in (commit-ts,
// start-ts, key) order. The draws are the same whatever the filter, so a
// filtered tick is always a subsequence of the unfiltered one.
func (g *tickGen) appendTick(dst []common.Row, table, tick int64, n int, lo, hi common.Ts, span *common.Span) []common.Row {
	w := g.w
	g.plan(table, tick, n)
	if n == 0 {
		return dst
	}
	// First pass: draw everything and note the rows that pass the filter.
	base := w.tickBase(tick)
	g.picked = g.picked[:0]
	bytesNeeded := 0
	j := 0 // transaction index within the tick
	for gi, size := range g.groups {
		commit := base + common.Ts(n+1+gi)
		if commit > hi {
			break // later groups commit later still
		}
		in := commit > lo
		// A commit-ts group never writes a key twice: transactions that
		// commit at the same ts cannot both have written one key.
		clear(g.seen)
		g.keys = g.keys[:0]
		for range size * w.txnRows {
			k := g.rng.Uint64N(w.keysPerTable)
			for g.haveKey(k, size*w.txnRows) {
				k = (k + 1) % w.keysPerTable
			}
			g.keys = append(g.keys, k)
		}
		for t := range size {
			txnKeys := g.keys[t*w.txnRows : (t+1)*w.txnRows]
			slices.Sort(txnKeys)
			start := base + common.Ts(1+j)
			j++
			for _, k := range txnKeys {
				p := pickedRow{key: k, start: start, commit: commit}
				p.del = g.rng.Uint32N(100) < deletePercent
				p.valueSeed = g.rng.Uint64()
				if !in {
					continue
				}
				if kb := encodeKey(k); span != nil && !span.Contains(kb[:]) {
					continue
				}
				g.picked = append(g.picked, p)
				bytesNeeded += 8
				if !p.del {
					bytesNeeded += w.rowBytes
				}
			}
		}
	}
	if len(g.picked) == 0 {
		return dst
	}
	// Second pass: one exactly sized allocation for all keys and values of
	// the tick. Each row gets a capped, non-overlapping window of it, so
	// whoever owns a row may modify or append to it without touching others.
	slab := make([]byte, bytesNeeded)
	dst = slices.Grow(dst, len(g.picked))
	for _, p := range g.picked {
		row := common.Row{Op: common.OpPut, StartTs: p.start, CommitTs: p.commit}
		kb := encodeKey(p.key)
		row.Key = slab[:8:8]
		copy(row.Key, kb[:])
		slab = slab[8:]
		if p.del {
			row.Op = common.OpDelete
		} else {
			row.Value = slab[:w.rowBytes:w.rowBytes]
			fillValue(row.Value, p.valueSeed)
			slab = slab[w.rowBytes:]
		}
		dst = append(dst, row)
	}
	return dst
}

// pickedRow is a row chosen by appendTick's first pass.
type pickedRow struct {
	key, valueSeed uint64
	start, commit  common.Ts
	del            bool
}

// encodeKey returns the row key of key number k: 8 bytes big-endian, so byte
// order is numeric order.
func encodeKey(k uint64) [8]byte {
	var kb [8]byte
	binary.BigEndian.PutUint64(kb[:], k)
	return kb
}

// haveKey reports whether k is already among g.keys, switching to a map for
// large groups so the check stays O(1).
func (g *tickGen) haveKey(k uint64, groupRows int) bool {
	if groupRows <= 32 {
		return slices.Contains(g.keys, k)
	}
	if g.seen == nil {
		g.seen = make(map[uint64]struct{}, groupRows)
	}
	if _, ok := g.seen[k]; ok {
		return true
	}
	g.seen[k] = struct{}{}
	return false
}

// fillValue fills b with bytes that are a pure function of seed. It is the
// hot loop of row generation, so it uses wyrand (one multiply per 8 bytes);
// the bytes need to be deterministic and varied, not of statistical quality.
func fillValue(b []byte, seed uint64) {
	for len(b) >= 8 {
		seed += 0xa0761d6478bd642f
		hi, lo := bits.Mul64(seed, seed^0xe7037ed1a0b428db)
		binary.LittleEndian.PutUint64(b, hi^lo)
		b = b[8:]
	}
	if len(b) > 0 {
		seed += 0xa0761d6478bd642f
		hi, lo := bits.Mul64(seed, seed^0xe7037ed1a0b428db)
		var tail [8]byte
		binary.LittleEndian.PutUint64(tail[:], hi^lo)
		copy(b, tail[:])
	}
}

// rows returns the rows of table with commit-ts in (start, end], limited to
// span when span is not nil.
func (w *workload) rows(table int64, start, end common.Ts, span *common.Span) []common.Row {
	lo, hi, ok := w.clamp(start, end)
	if !ok || !w.validTable(table) {
		return nil
	}
	g := newTickGen(w)
	// Counting first is cheap (a hash per whole tick) and saves growing a
	// slice of pointer-rich rows several times.
	capacity := w.rowCount(table, lo, hi)
	if capacity == 0 {
		return nil
	}
	out := make([]common.Row, 0, capacity)
	last := w.tickOf(hi)
	for k, n, ok := w.nextTick(table, w.tickOf(lo), last); ok; k, n, ok = w.nextTick(table, k+1, last) {
		out = g.appendTick(out, table, k, n, lo, hi, span)
	}
	return out
}

// rowCount returns len(rows(table, start, end, nil)) without generating
// keys or values.
func (w *workload) rowCount(table int64, start, end common.Ts) int {
	lo, hi, ok := w.clamp(start, end)
	if !ok || !w.validTable(table) {
		return 0
	}
	g := newTickGen(w)
	total := 0
	last := w.tickOf(hi)
	for k, n, ok := w.nextTick(table, w.tickOf(lo), last); ok; k, n, ok = w.nextTick(table, k+1, last) {
		total += g.countInRange(table, k, n, lo, hi)
	}
	return total
}

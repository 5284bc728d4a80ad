package upstream

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
)

// busyOptions is a small workload dense enough that every tick of every
// table has several transactions, so commit-ts groups are exercised.
func busyOptions(seed uint64) GeneratorOptions {
	return GeneratorOptions{
		Tables:          4,
		RowsPerSec:      24000,
		TxnRows:         3,
		RowBytes:        20,
		TxnsPerCommitTs: 3,
		KeysPerTable:    500,
		Seed:            seed,
		StartTs:         common.TsFromTime(t0),
		Clock:           clock.NewFake(t0),
	}
}

func newTestGenerator(t *testing.T, o GeneratorOptions) *Generator {
	t.Helper()
	g, err := NewGenerator(o)
	require.NoError(t, err)
	t.Cleanup(g.Close)
	return g
}

func tsAt(ms int64, logical int64) common.Ts {
	return common.TsFromTime(t0) + common.ComposeTs(ms, logical)
}

func TestRowsDeterministicAcrossCallsAndInstances(t *testing.T) {
	g1 := newTestGenerator(t, busyOptions(42))
	g2 := newTestGenerator(t, busyOptions(42))
	other := newTestGenerator(t, busyOptions(43))
	a, b := tsAt(0, 0), tsAt(500, 0)
	for table := int64(1); table <= 4; table++ {
		first := g1.Rows(table, a, b)
		require.NotEmpty(t, first)
		require.Equal(t, first, g1.Rows(table, a, b), "same instance, asked twice")
		require.Equal(t, first, g2.Rows(table, a, b), "two instances, same seed")
		require.NotEqual(t, first, other.Rows(table, a, b), "different seed")
	}
	// Asking for other tables or other ranges first changes nothing.
	g3 := newTestGenerator(t, busyOptions(42))
	_ = g3.Rows(3, tsAt(100, 0), tsAt(900, 0))
	require.Equal(t, g1.Rows(2, a, b), g3.Rows(2, a, b))
}

func TestRowsSplitIsAdditive(t *testing.T) {
	g := newTestGenerator(t, busyOptions(7))
	a, c := tsAt(0, 0), tsAt(200, 0)
	whole := g.Rows(1, a, c)
	require.Equal(t, len(whole), g.RowCount(1, a, c))

	// Split points: every commit-ts shared by several transactions (and its
	// neighbours), tick boundaries, and random timestamps.
	var splits []common.Ts
	shared := 0
	for i := 1; i < len(whole); i++ {
		if whole[i].CommitTs == whole[i-1].CommitTs && whole[i].StartTs != whole[i-1].StartTs {
			if shared%8 == 0 { // a sample keeps the test fast
				ts := whole[i].CommitTs
				splits = append(splits, ts-1, ts, ts+1)
			}
			shared++
		}
	}
	require.Positive(t, shared, "no commit-ts is shared by several transactions")
	for ms := int64(0); ms <= 200; ms += 40 {
		splits = append(splits, tsAt(ms, 0)-1, tsAt(ms, 0))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 20 {
		splits = append(splits, a+common.Ts(rng.Uint64N(uint64(c-a))))
	}
	for _, b := range splits {
		left, right := g.Rows(1, a, b), g.Rows(1, b, c)
		require.Equal(t, whole, append(left, right...), "split at %v", b)
		require.Equal(t, len(left), g.RowCount(1, a, b), "count split at %v", b)
		require.Equal(t, len(right), g.RowCount(1, b, c), "count split at %v", b)
	}
}

func TestRowsShape(t *testing.T) {
	o := busyOptions(3)
	g := newTestGenerator(t, o)
	a, c := tsAt(0, 5), tsAt(300, 0)
	for table := int64(1); table <= int64(o.Tables); table++ {
		rows := g.Rows(table, a, c)
		require.NotEmpty(t, rows)
		span := common.TableSpan(table)
		type txn struct{ start, commit common.Ts }
		txnRows := map[txn]int{}
		txnsPerCommit := map[common.Ts]map[common.Ts]bool{}
		keysPerCommit := map[common.Ts]map[string]bool{}
		seenOps := map[common.OpType]int{}
		var prev *common.Row
		for i := range rows {
			r := &rows[i]
			require.True(t, span.Contains(r.Key))
			require.Len(t, r.Key, 8)
			require.Less(t, binary.BigEndian.Uint64(r.Key), uint64(o.KeysPerTable))
			require.Less(t, r.StartTs, r.CommitTs)
			require.Greater(t, r.CommitTs, a)
			require.LessOrEqual(t, r.CommitTs, c)
			require.Equal(t, r.StartTs.PhysicalMs()/10, r.CommitTs.PhysicalMs()/10, "transaction leaves its tick")
			seenOps[r.Op]++
			switch r.Op {
			case common.OpPut:
				require.Len(t, r.Value, o.RowBytes)
			case common.OpDelete:
				require.Empty(t, r.Value)
			default:
				t.Fatalf("invalid op %v", r.Op)
			}
			if prev != nil {
				order := cmp.Or(cmp.Compare(prev.CommitTs, r.CommitTs), cmp.Compare(prev.StartTs, r.StartTs), bytes.Compare(prev.Key, r.Key))
				require.Negative(t, order, "rows %d and %d out of order", i-1, i)
				if prev.StartTs != r.StartTs || prev.CommitTs != r.CommitTs {
					require.Zero(t, txnRows[txn{r.StartTs, r.CommitTs}], "transaction not contiguous")
				}
			}
			txnRows[txn{r.StartTs, r.CommitTs}]++
			if txnsPerCommit[r.CommitTs] == nil {
				txnsPerCommit[r.CommitTs] = map[common.Ts]bool{}
				keysPerCommit[r.CommitTs] = map[string]bool{}
			}
			txnsPerCommit[r.CommitTs][r.StartTs] = true
			require.False(t, keysPerCommit[r.CommitTs][string(r.Key)], "key written twice at one commit-ts")
			keysPerCommit[r.CommitTs][string(r.Key)] = true
			prev = r
		}
		for tx, n := range txnRows {
			require.Equal(t, o.TxnRows, n, "txn %v", tx)
		}
		maxShared := 0
		for _, starts := range txnsPerCommit {
			maxShared = max(maxShared, len(starts))
		}
		require.LessOrEqual(t, maxShared, o.TxnsPerCommitTs)
		require.Greater(t, maxShared, 1, "TxnsPerCommitTs not exercised")
		require.Positive(t, seenOps[common.OpPut])
		require.Positive(t, seenOps[common.OpDelete])
	}
}

func TestRowsBoundsAndSpans(t *testing.T) {
	o := busyOptions(5)
	o.EndTs = tsAt(100, 2)
	g := newTestGenerator(t, o)
	require.Nil(t, g.Rows(0, 0, tsAt(50, 0)), "unknown table")
	require.Nil(t, g.Rows(int64(o.Tables)+1, 0, tsAt(50, 0)), "unknown table")
	require.Nil(t, g.Rows(1, tsAt(50, 0), tsAt(50, 0)), "empty range")
	require.Nil(t, g.Rows(1, tsAt(60, 0), tsAt(50, 0)), "reversed range")
	require.Zero(t, g.RowCount(1, tsAt(60, 0), tsAt(50, 0)))

	// (StartTs, EndTs] bounds the workload.
	require.Equal(t, g.Rows(1, o.StartTs, o.EndTs), g.Rows(1, 0, o.EndTs+common.ComposeTs(1000, 0)))
	all := g.Rows(1, 0, tsAt(1000, 0))
	require.NotEmpty(t, all)
	require.Greater(t, all[0].CommitTs, o.StartTs)
	require.LessOrEqual(t, all[len(all)-1].CommitTs, o.EndTs)
	require.Equal(t, len(all), g.RowCount(1, 0, tsAt(1000, 0)))

	// SpanRows is Rows filtered by the span.
	span := common.Span{TableID: 2, StartKey: be64(100), EndKey: be64(300)}
	var want []common.Row
	for _, r := range g.Rows(2, 0, o.EndTs) {
		if span.Contains(r.Key) {
			want = append(want, r)
		}
	}
	require.NotEmpty(t, want)
	require.Equal(t, want, g.SpanRows(span, 0, o.EndTs))
	require.Equal(t, g.Rows(2, 0, o.EndTs), g.SpanRows(common.TableSpan(2), 0, o.EndTs))
}

func be64(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }

// TestLongRunRates checks that over a simulated minute the row count is
// within 1% of RowsPerSec*duration and the hot tables' share within 0.01 of
// HotFraction. The per-tick counts are Bernoulli-rounded, so the relative
// standard deviation here is about 0.1%: the tolerances are ~10 sigma.
func TestLongRunRates(t *testing.T) {
	const seconds = 60
	o := GeneratorOptions{
		Tables: 50, RowsPerSec: 10000, TxnRows: 4, HotFraction: 0.8, HotTables: 5,
		Seed: 11, StartTs: common.TsFromTime(t0), Clock: clock.NewFake(t0),
	}
	g := newTestGenerator(t, o)
	end := o.StartTs + common.ComposeTs(seconds*1000, 0)
	total, hot := 0, 0
	for table := int64(1); table <= int64(o.Tables); table++ {
		n := g.RowCount(table, o.StartTs, end)
		total += n
		if table <= int64(o.HotTables) {
			hot += n
		}
	}
	want := float64(o.RowsPerSec * seconds)
	require.InEpsilon(t, want, float64(total), 0.01, "total rows")
	require.InDelta(t, o.HotFraction, float64(hot)/float64(total), 0.01, "hot share")
	// The cheap count agrees with the rows themselves.
	require.Len(t, g.Rows(1, o.StartTs, end), g.RowCount(1, o.StartTs, end))
	require.Len(t, g.Rows(50, o.StartTs, end), g.RowCount(50, o.StartTs, end))

	// Uniform (HotFraction 0): every table gets about the same share.
	o.HotFraction, o.HotTables = 0, 0
	u := newTestGenerator(t, o)
	for table := int64(1); table <= int64(o.Tables); table++ {
		require.InEpsilon(t, want/float64(o.Tables), float64(u.RowCount(table, o.StartTs, end)), 0.05, "table %d", table)
	}
}

func TestDefaultStartTsComesFromClock(t *testing.T) {
	now := t0.Add(1234 * time.Millisecond)
	g := newTestGenerator(t, GeneratorOptions{Clock: clock.NewFake(now)})
	require.Equal(t, frontierAt(now, DefaultTick), g.Options().StartTs)
	require.Equal(t, g.Options().StartTs, g.ResolvedTs())
	// The resolved options rebuild the same workload.
	g2 := newTestGenerator(t, g.Options())
	end := g.Options().StartTs + common.ComposeTs(2000, 0)
	require.Equal(t, g.Rows(1, 0, end), g2.Rows(1, 0, end))
}

// TestRowsGolden pins the row function: a change to it silently breaks
// every comparison against data generated by an older build, so it must be
// deliberate (update the constant and say so in the commit).
func TestRowsGolden(t *testing.T) {
	g := newTestGenerator(t, busyOptions(2024))
	h := fnv.New64a()
	for _, r := range g.Rows(2, tsAt(0, 0), tsAt(100, 0)) {
		fmt.Fprintf(h, "%d|%x|%x|%d|%d;", r.Op, r.Key, r.Value, r.StartTs, r.CommitTs)
	}
	require.Equal(t, uint64(0xa74b9eac4d5f78ff), h.Sum64())
}

func abs64(x int64) int64 {
	if x < 0 {
		return ^x
	}
	return x
}

// TestTickMemoAnswersAsTheWorkloadDoes asks a subscription's memo what the
// driver asks (a tick, the ticks up to a frontier, the ticks before a
// resolved boundary), in the driver's order and at random, over sparse
// tables of several rates and a dense one: every answer is nextTick's.
// A memo that answered past what it searched, or from before where it
// searched, would give a tick with rows where there is none or miss one.
func TestTickMemoAnswersAsTheWorkloadDoes(t *testing.T) {
	for _, tables := range []int{1, 100, 10_000, 1_000_000} {
		t.Run(fmt.Sprintf("tables=%d", tables), func(t *testing.T) {
			g := newTestGenerator(t, GeneratorOptions{Tables: tables, RowsPerSec: 20000, TxnRows: 4,
				Seed: 7, StartTs: common.TsFromTime(t0), Clock: clock.NewFake(t0)})
			w := g.w
			rng := rand.New(rand.NewPCG(uint64(tables), 3))
			base := w.tickOf(common.TsFromTime(t0))
			hits, asked := 0, 0
			for table := int64(1); table <= min(int64(tables), 20); table++ {
				var m tickMemo
				from := base
				for range 2000 {
					var lo, hi int64
					switch rng.IntN(6) {
					case 0: // one tick (tickRows)
						lo, hi = from, from
					case 1: // up to the frontier (feed)
						lo, hi = from, from+rng.Int64N(150)
					case 2: // before a far boundary (nextDue)
						lo, hi = from, from+rng.Int64N(1<<20)
					case 3: // just past what the memo searched
						lo = max(from, m.from)
						hi = ^m.next + 1 + rng.Int64N(64)
						if m.next >= 0 {
							hi = m.next - 1 + rng.Int64N(3)
						}
					case 4: // at and just after the tick it found
						lo = max(base, abs64(m.next)+rng.Int64N(3)-1)
						hi = lo + rng.Int64N(64)
					default: // anywhere around, backwards too
						lo = max(base, from+rng.Int64N(4000)-2000)
						hi = lo + rng.Int64N(3000) - 10
					}
					wantTick, wantN, wantOK := w.nextTick(table, lo, hi)
					before := m
					gotTick, gotN, gotOK := w.nextTickMemo(&m, table, lo, hi)
					require.Equal(t, [3]any{wantTick, wantN, wantOK}, [3]any{gotTick, gotN, gotOK},
						"table %d ticks [%d, %d], memo before %+v", table, lo, hi, before)
					asked++
					if m == before {
						hits++
					}
					from += rng.Int64N(120)
				}
			}
			t.Logf("%d of %d questions left the memo as it was", hits, asked)
			if tables == 1_000_000 { // a row every few minutes: the memo answers most
				require.Greater(t, hits, asked*3/4, "questions answered from the memo")
			}
		})
	}
}

package schemastore

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/cdcflow/eventservice/pkg/common"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func newMemory(t *testing.T, resolved common.Ts, ddls ...DDL) *Memory {
	t.Helper()
	m, err := NewMemory(MemoryOptions{InitialResolvedTs: resolved, InitialDDLs: ddls})
	require.NoError(t, err)
	return m
}

func commitTsOf(ddls []DDL) []common.Ts {
	out := make([]common.Ts, len(ddls))
	for i, d := range ddls {
		out[i] = d.CommitTs
	}
	return out
}

func TestNewMemoryOptions(t *testing.T) {
	m, err := NewMemory(MemoryOptions{})
	require.NoError(t, err)
	require.Zero(t, m.ResolvedTs())

	// Initial history may lie below the initial frontier and come unsorted.
	m = newMemory(t, 50, DDL{TableID: 1, CommitTs: 30}, DDL{TableID: 1, CommitTs: 10}, DDL{TableID: 2, CommitTs: 20})
	require.Equal(t, common.Ts(50), m.ResolvedTs())
	got, err := m.FetchDDLs(1, 0, 50, nil)
	require.NoError(t, err)
	require.Equal(t, []common.Ts{10, 30}, commitTsOf(got))
	_, last := m.TableState(2)
	require.Equal(t, common.Ts(20), last)

	_, err = NewMemory(MemoryOptions{InitialDDLs: []DDL{
		{TableID: -1, CommitTs: 5},
		{TableID: 1, CommitTs: 0},
		{TableID: 1, CommitTs: 7},
		{TableID: 1, CommitTs: 7},
	}})
	require.ErrorIs(t, err, ErrInvalidOptions)
	require.ErrorIs(t, err, ErrInvalidDDL)
	require.ErrorIs(t, err, ErrDuplicateDDL)
	// Every violation is reported, not just the first.
	require.Contains(t, err.Error(), "InitialDDLs[0]")
	require.Contains(t, err.Error(), "InitialDDLs[1]")
	require.Contains(t, err.Error(), "InitialDDLs[3]")
}

func TestFetchDDLsRangeBounds(t *testing.T) {
	m := newMemory(t, 40,
		DDL{TableID: 1, CommitTs: 10, Query: "a"},
		DDL{TableID: 1, CommitTs: 20, Query: "b"},
		DDL{TableID: 1, CommitTs: 30, Query: "c"},
		DDL{TableID: 2, CommitTs: 20, Query: "other table"},
	)
	for _, tc := range []struct {
		start, end common.Ts
		want       []common.Ts
	}{
		{0, 40, []common.Ts{10, 20, 30}},
		{10, 30, []common.Ts{20, 30}}, // start exclusive, end inclusive
		{9, 10, []common.Ts{10}},
		{10, 10, []common.Ts{}},
		{10, 19, []common.Ts{}},
		{19, 20, []common.Ts{20}},
		{30, 40, []common.Ts{}},
		{0, 0, []common.Ts{}},
	} {
		got, err := m.FetchDDLs(1, tc.start, tc.end, nil)
		require.NoError(t, err)
		require.Equal(t, tc.want, commitTsOf(got), "(%d, %d]", tc.start, tc.end)
	}

	// Results are appended to dst and carry the whole DDL.
	dst := []DDL{{TableID: 9, CommitTs: 1, Query: "keep"}}
	dst, err := m.FetchDDLs(1, 15, 25, dst)
	require.NoError(t, err)
	require.Equal(t, []DDL{{TableID: 9, CommitTs: 1, Query: "keep"}, {TableID: 1, CommitTs: 20, Query: "b"}}, dst)

	got, err := m.FetchDDLs(7, 0, 40, nil)
	require.NoError(t, err)
	require.Empty(t, got, "unknown table has no DDLs")
}

func TestFetchDDLsMatchesNaiveOracle(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	m := newMemory(t, 0)
	var all []DDL
	// Add in random order above the frontier; the store must sort.
	for _, ts := range r.Perm(200) {
		if r.IntN(3) == 0 {
			continue
		}
		d := DDL{TableID: 3, CommitTs: common.Ts(ts + 1)}
		require.NoError(t, m.AddDDL(d))
		all = append(all, d)
	}
	require.NoError(t, m.AdvanceResolvedTs(300))
	slices.SortFunc(all, func(a, b DDL) int { return cmp.Compare(a.CommitTs, b.CommitTs) })
	for range 500 {
		start := common.Ts(r.IntN(301))
		end := start + common.Ts(r.IntN(301-int(start)))
		var want []DDL
		for _, d := range all {
			if d.CommitTs > start && d.CommitTs <= end {
				want = append(want, d)
			}
		}
		got, err := m.FetchDDLs(3, start, end, nil)
		require.NoError(t, err)
		require.Equal(t, want, got, "(%d, %d]", start, end)
	}
}

func TestFetchDDLsBadInput(t *testing.T) {
	m := newMemory(t, 40, DDL{TableID: 1, CommitTs: 10})
	dst := []DDL{{Query: "untouched"}}
	for _, tc := range []struct {
		name       string
		table      int64
		start, end common.Ts
		want       error
	}{
		{"start after end", 1, 20, 10, ErrInvalidRange},
		{"negative table", -1, 0, 10, ErrInvalidRange},
		{"end above frontier", 1, 0, 41, ErrRangeAboveResolved},
		{"end above frontier, unknown table", 5, 0, 41, ErrRangeAboveResolved},
	} {
		got, err := m.FetchDDLs(tc.table, tc.start, tc.end, dst)
		require.ErrorIs(t, err, tc.want, tc.name)
		require.Equal(t, []DDL{{Query: "untouched"}}, got, tc.name)
	}
}

func TestTableStateOnlySeesDDLsAtOrBelowFrontier(t *testing.T) {
	m := newMemory(t, 100, DDL{TableID: 1, CommitTs: 90})
	r, last := m.TableState(1)
	require.Equal(t, common.Ts(100), r)
	require.Equal(t, common.Ts(90), last)

	r, last = m.TableState(2)
	require.Equal(t, common.Ts(100), r)
	require.Zero(t, last, "table without DDLs")
	_, last = m.TableState(-3)
	require.Zero(t, last, "negative table id has no DDLs")

	// Added above the frontier: invisible to TableState and FetchDDLs.
	require.NoError(t, m.AddDDL(DDL{TableID: 1, CommitTs: 120}))
	require.NoError(t, m.AddDDL(DDL{TableID: 1, CommitTs: 110}))
	r, last = m.TableState(1)
	require.Equal(t, common.Ts(100), r)
	require.Equal(t, common.Ts(90), last)
	_, err := m.FetchDDLs(1, 90, 110, nil)
	require.ErrorIs(t, err, ErrRangeAboveResolved)

	require.NoError(t, m.AdvanceResolvedTs(109))
	_, last = m.TableState(1)
	require.Equal(t, common.Ts(90), last, "frontier just below the DDL")

	require.NoError(t, m.AdvanceResolvedTs(110))
	r, last = m.TableState(1)
	require.Equal(t, common.Ts(110), r)
	require.Equal(t, common.Ts(110), last, "frontier exactly at the DDL")

	require.NoError(t, m.AdvanceResolvedTs(500))
	r, last = m.TableState(1)
	require.Equal(t, common.Ts(500), r)
	require.Equal(t, common.Ts(120), last)
	_, last = m.TableState(2)
	require.Zero(t, last, "other tables are not affected")
}

func TestAddDDLBadInput(t *testing.T) {
	m := newMemory(t, 100)
	require.NoError(t, m.AddDDL(DDL{TableID: 1, CommitTs: 150, Query: "first"}))
	// Same commit-ts on another table is fine: DDLs are unique per table.
	require.NoError(t, m.AddDDL(DDL{TableID: 2, CommitTs: 150}))
	// Table 0 is a valid table.
	require.NoError(t, m.AddDDL(DDL{TableID: 0, CommitTs: 101}))

	for _, tc := range []struct {
		name string
		ddl  DDL
		want error
	}{
		{"negative table", DDL{TableID: -1, CommitTs: 200}, ErrInvalidDDL},
		{"zero commit-ts", DDL{TableID: 1}, ErrInvalidDDL},
		{"at frontier", DDL{TableID: 1, CommitTs: 100}, ErrDDLBeforeFrontier},
		{"below frontier", DDL{TableID: 1, CommitTs: 5}, ErrDDLBeforeFrontier},
		{"duplicate", DDL{TableID: 1, CommitTs: 150, Query: "second"}, ErrDuplicateDDL},
	} {
		require.ErrorIs(t, m.AddDDL(tc.ddl), tc.want, tc.name)
	}
	// The rejected DDLs left no trace.
	require.NoError(t, m.AdvanceResolvedTs(300))
	got, err := m.FetchDDLs(1, 0, 300, nil)
	require.NoError(t, err)
	require.Equal(t, []DDL{{TableID: 1, CommitTs: 150, Query: "first"}}, got)
}

func TestAdvanceResolvedTs(t *testing.T) {
	m := newMemory(t, 10)
	var seen []common.Ts
	cancel := m.Subscribe(func(ts common.Ts) { seen = append(seen, ts) })
	defer cancel()

	err := m.AdvanceResolvedTs(9)
	require.ErrorIs(t, err, ErrResolvedTsRegressed)
	require.Equal(t, common.Ts(10), m.ResolvedTs())
	require.NoError(t, m.AdvanceResolvedTs(10), "equal is a no-op")
	require.Empty(t, seen, "neither a regression nor a no-op notifies")

	require.NoError(t, m.AdvanceResolvedTs(11))
	require.NoError(t, m.AdvanceResolvedTs(11))
	require.NoError(t, m.AdvanceResolvedTs(20))
	require.Equal(t, []common.Ts{11, 20}, seen)
	require.Equal(t, common.Ts(20), m.ResolvedTs())
}

func TestGC(t *testing.T) {
	m := newMemory(t, 100,
		DDL{TableID: 1, CommitTs: 10},
		DDL{TableID: 1, CommitTs: 20},
		DDL{TableID: 1, CommitTs: 30},
		DDL{TableID: 2, CommitTs: 10},
	)
	n, err := m.GC(1, 25)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	n, err = m.GC(1, 25)
	require.NoError(t, err)
	require.Zero(t, n, "GC is idempotent")

	got, err := m.FetchDDLs(1, 20, 100, nil)
	require.NoError(t, err, "nothing was dropped in (20, 100]")
	require.Equal(t, []common.Ts{30}, commitTsOf(got))
	_, err = m.FetchDDLs(1, 19, 100, nil)
	require.ErrorIs(t, err, ErrRangeTruncated, "the DDL at 20 was dropped")

	// Other tables are untouched.
	got, err = m.FetchDDLs(2, 0, 100, nil)
	require.NoError(t, err)
	require.Equal(t, []common.Ts{10}, commitTsOf(got))

	// Dropping the table's last DDL must not make TableState report "no
	// DDL": a reader below it would wrongly take the no-scan fast path.
	n, err = m.GC(1, 100)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, last := m.TableState(1)
	require.Equal(t, common.Ts(30), last)

	_, err = m.GC(1, 101)
	require.ErrorIs(t, err, ErrRangeAboveResolved)
	_, err = m.GC(-1, 10)
	require.ErrorIs(t, err, ErrInvalidRange)
	n, err = m.GC(42, 10)
	require.NoError(t, err)
	require.Zero(t, n)
}

package main

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Pure helpers only: nothing here starts a server.

func TestPercentileAndMedian(t *testing.T) {
	xs := []float64{5, 1, 4, 2, 3, 10, 9, 8, 7, 6}
	for _, c := range []struct{ p, want float64 }{{50, 5}, {99, 10}, {100, 10}, {10, 1}, {1, 1}} {
		if got := percentile(xs, c.p); got != c.want {
			t.Errorf("percentile(%v) = %v, want %v", c.p, got, c.want)
		}
	}
	if got := percentile(nil, 50); got != -1 {
		t.Errorf("percentile of nothing = %v, want -1", got)
	}
	if xs[0] != 5 {
		t.Errorf("percentile sorted its argument")
	}
	if got := median([]float64{3, -1, 1, 2}); got != 2 {
		t.Errorf("median skips unmeasured values: got %v, want 2", got)
	}
	if got := median([]float64{4, 1, 3, 2}); got != 2.5 {
		t.Errorf("median of four = %v, want 2.5", got)
	}
	if got := median([]float64{-1}); got != -1 {
		t.Errorf("median of nothing measured = %v, want -1", got)
	}
}

func res(mode string, tables int, rows, p99, drain float64, verified, failure string) result {
	r := newResult(mode, tables)
	r.rowsPerSec, r.lagP99, r.drainRate, r.verified, r.failure = rows, p99, drain, verified, failure
	return r
}

// A run that did not verify is marked in the table and the goals, never
// dropped; medians are per configuration.
func TestSummaryMarksFailuresAndGoals(t *testing.T) {
	rs := []result{
		res(modeNone, 1000, 20000, -1, -1, "n/a", ""),
		res(modeNative, 1000, 15000, 200, 20000, "yes", ""),
		res(modeCDCFlow, 1000, 16000, 800, 30000, "yes", ""),
		res(modeNone, 1000, 22000, -1, -1, "n/a", ""),
		res(modeNative, 1000, 17000, 300, 22000, "yes", ""),
		res(modeCDCFlow, 1000, 14000, 1200, 10000, "NO", "run 2: compare: DIFFERENT"),
	}
	ss := summarize(rs)
	if len(ss) != 3 {
		t.Fatalf("%d summaries, want 3", len(ss))
	}
	c, _ := find(ss, modeCDCFlow, 1000)
	if c.rowsPerSec != 15000 || c.lagP99 != 1000 || c.verified != "NO 1/2" {
		t.Errorf("cdcflow summary: %+v", c)
	}
	out := render(ss)
	for _, want := range []string{
		"NO 1/2",
		"source slowed no more than by native: cdcflow 0.71 of the baseline, native 0.76: NOT MET",
		"lag p99 <= 1 s: cdcflow 1000 ms: met",
		"cdcflow 20000 rows/s, native 21000 rows/s: NOT MET",
		"target equal to source (compare at the end of every run): NOT MET (cdcflow/1000)",
		"FAILED cdcflow/1000: run 2: compare: DIFFERENT",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in\n%s", want, out)
		}
	}
}

// perRow divides each present part's CPU by the rows and totals them; an
// absent part is -1 and left out of the total, and no rows measure
// nothing.
func TestPerRow(t *testing.T) {
	from := cpuParts{time.Second, 2 * time.Second, 0}
	to := cpuParts{3 * time.Second, 3 * time.Second, 0}
	require.Equal(t, [4]float64{20, 10, -1, 30}, perRow(from, to, [3]bool{true, true, false}, 100000))
	require.Equal(t, [4]float64{-1, -1, -1, -1}, perRow(from, to, [3]bool{true, true, true}, 0))
}

// The median 10 s rate is a column of its own with its own ratio and an
// informational line beside the goal, whose verdict stays the whole
// load's rate.
func TestTheWindowRateIsReportedBesideTheGoal(t *testing.T) {
	withWindow := func(r result, w float64) result { r.windowRate = w; return r }
	ss := summarize([]result{
		withWindow(res(modeNone, 1000, 20000, -1, -1, "n/a", ""), 25000),
		withWindow(res(modeNative, 1000, 16000, 200, 20000, "yes", ""), 20000),
		withWindow(res(modeCDCFlow, 1000, 12000, 300, 20000, "yes", ""), 19000),
		withWindow(res(modeCDCFlow, 1000, 14000, 300, 20000, "yes", ""), 21000),
	})
	c, _ := find(ss, modeCDCFlow, 1000)
	require.Equal(t, 20000.0, c.windowRate)
	out := render(ss)
	require.Contains(t, out, "source rows/s  vs none 10s median  vs none")
	// cdcflow's row: the whole rate 13000 (0.65 of none), the median 10 s 20000 (0.80).
	require.Regexp(t, `cdcflow\s+1000\s+13000\s+0\.65\s+20000\s+0\.80\s`, out)
	for _, want := range []string{
		"source slowed no more than by native: cdcflow 0.65 of the baseline, native 0.80: NOT MET",
		"1000 tables, the same by the median 10 s of the load: cdcflow 0.80 of the baseline, native 0.80 (cdcflow 1.00 of native)",
	} {
		require.Contains(t, out, want)
	}
}

// Each run takes the modes in another order, so that no mode always
// follows the same one; run 0 takes them as given.
func TestEachRunTakesTheModesInAnotherOrder(t *testing.T) {
	modes := []string{modeNone, modeNative, modeCDCFlow}
	var orders [][]string
	for r := range 7 {
		orders = append(orders, orderOfRun(modes, r))
	}
	require.Equal(t, modes, orders[0])
	require.Equal(t, []string{modeNone, modeCDCFlow, modeNative}, orders[1])
	require.Equal(t, []string{modeNative, modeNone, modeCDCFlow}, orders[2])
	require.Equal(t, orders[0], orders[6], "runs beyond the permutations start over")
	for r, o := range orders[:6] {
		require.ElementsMatch(t, modes, o, "run %d", r)
		for _, p := range orders[:r] {
			require.NotEqual(t, p, o, "run %d repeats an order", r)
		}
	}
	// cdcflow follows native in only one of the first three runs.
	after := 0
	for _, o := range orders[:3] {
		for i := 1; i < len(o); i++ {
			if o[i] == modeCDCFlow && o[i-1] == modeNative {
				after++
			}
		}
	}
	require.Equal(t, 1, after)
	require.Equal(t, []string{modeCDCFlow}, orderOfRun([]string{modeCDCFlow}, 3))
}

// A source's children are told apart by the titles PostgreSQL 15 gives
// them; what each part spent per row is printed in a fixed order.
func TestServerPartsByTitle(t *testing.T) {
	for title, want := range map[string]string{
		"postgres: walsender postgres 127.0.0.1(40122) START_REPLICATION": "walsender",
		"postgres: autovacuum worker postgres":                            "autovacuum",
		"postgres: autovacuum launcher":                                   "other",
		"postgres: checkpointer":                                          "other",
		"postgres: background writer":                                     "other",
		"postgres: walwriter":                                             "other",
		"postgres: logical replication launcher":                          "other",
		"postgres: postgres postgres 127.0.0.1(40100) idle":               "backends",
		"postgres: postgres postgres 127.0.0.1(40100) COMMIT":             "backends",
		"/usr/lib/postgresql/15/bin/postgres -D /tmp/x/data":              "other",
	} {
		require.Equal(t, want, serverPart(title), title)
	}
	from := map[string]time.Duration{"backends": time.Second, "walsender": 0}
	to := map[string]time.Duration{"backends": 3 * time.Second, "walsender": time.Second, "autovacuum": 500 * time.Millisecond}
	require.Equal(t, "backends 20 walsender 10 autovacuum 5 other 0", splitPerRow(from, to, 100000))
	require.Equal(t, "-", splitPerRow(nil, to, 100000))
	require.Equal(t, "-", splitPerRow(from, to, 0))
}

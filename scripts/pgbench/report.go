package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Replication modes.
const (
	modeNone    = "none" // the baseline: no replication at all
	modeNative  = "native"
	modeCDCFlow = "cdcflow"
	// modeBaseline is cdcflow run from another build (-baseline): an A/B
	// of two builds in one sitting, interleaved; it counts for no goal.
	modeBaseline = "cdcflow-base"
)

// result is one run of one configuration. A figure that was not measured
// (the baseline's lag, a phase after a failure) is negative.
type result struct {
	mode   string
	tables int
	// rowsPerSec: the source's committed rows/s over the main load.
	rowsPerSec float64
	// windowRate: the median of the main load's rows/s over each whole
	// 10 s of it, which a slow start or a minute of autovacuum moves
	// less than the whole load's rate (docs/benchmarks.md says why both).
	windowRate float64
	// lag: probe lag samples (ms) at the target while the load ran.
	lagP50, lagP99, lagMax float64
	// catchUp: seconds from the fence's commit after the main load until
	// the target held it (every table's fence row and the last probe).
	catchUp float64
	// startUp: seconds from the restart of the stopped changefeed until
	// the target held the probe written just before the backlog.
	startUp float64
	// drain: seconds from the restart of the stopped changefeed until the
	// target held the backlog's fence; drainRate the backlog's rows/s.
	drain, drainRate float64
	// cpuLoad, cpuDrain: CPU per row (µs) of the source server, the
	// target server, the changefeed process and all three, over the main
	// load and over the drain (-1: not measured).
	cpuLoad, cpuDrain [4]float64
	// verified: "yes", "NO" (compare found a difference) or "n/a".
	verified string
	// failure says what went wrong, if anything did.
	failure string
}

func newResult(mode string, tables int) result {
	return result{mode: mode, tables: tables, rowsPerSec: -1, windowRate: -1, lagP50: -1, lagP99: -1, lagMax: -1,
		catchUp: -1, startUp: -1, drain: -1, drainRate: -1, verified: "n/a",
		cpuLoad: [4]float64{-1, -1, -1, -1}, cpuDrain: [4]float64{-1, -1, -1, -1}}
}

// ok is a run that measured everything and verified (or, the baseline,
// has nothing to verify).
func (r result) ok() bool {
	return r.failure == "" && (r.verified == "yes" || (r.mode == modeNone && r.verified == "n/a"))
}

// percentile is the nearest-rank p-th percentile (0 < p <= 100) of xs,
// -1 for none.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return -1
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

// median is the median of the measured (non-negative) values, -1 for
// none.
func median(xs []float64) float64 {
	var s []float64
	for _, x := range xs {
		if x >= 0 {
			s = append(s, x)
		}
	}
	if len(s) == 0 {
		return -1
	}
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// summary is the medians of one configuration's runs.
type summary struct {
	result
	runs, verifiedRuns int
	failures           []string
}

// summarize groups results by (mode, tables), in the order they first
// appear, and takes the median of every figure.
func summarize(rs []result) []summary {
	var out []summary
	for _, r := range rs {
		if slices.ContainsFunc(out, func(s summary) bool { return s.mode == r.mode && s.tables == r.tables }) {
			continue
		}
		var group []result
		for _, g := range rs {
			if g.mode == r.mode && g.tables == r.tables {
				group = append(group, g)
			}
		}
		s := summary{result: newResult(r.mode, r.tables), runs: len(group)}
		field := func(f func(result) float64) float64 {
			xs := make([]float64, len(group))
			for i, g := range group {
				xs[i] = f(g)
			}
			return median(xs)
		}
		s.rowsPerSec = field(func(g result) float64 { return g.rowsPerSec })
		s.windowRate = field(func(g result) float64 { return g.windowRate })
		s.lagP50 = field(func(g result) float64 { return g.lagP50 })
		s.lagP99 = field(func(g result) float64 { return g.lagP99 })
		s.lagMax = field(func(g result) float64 { return g.lagMax })
		s.catchUp = field(func(g result) float64 { return g.catchUp })
		s.startUp = field(func(g result) float64 { return g.startUp })
		s.drain = field(func(g result) float64 { return g.drain })
		s.drainRate = field(func(g result) float64 { return g.drainRate })
		for i := range s.cpuLoad {
			s.cpuLoad[i] = field(func(g result) float64 { return g.cpuLoad[i] })
			s.cpuDrain[i] = field(func(g result) float64 { return g.cpuDrain[i] })
		}
		for _, g := range group {
			if g.verified == "yes" {
				s.verifiedRuns++
			}
			if g.failure != "" {
				s.failures = append(s.failures, g.failure)
			}
		}
		switch {
		case r.mode == modeNone:
			s.verified = "n/a"
		case s.verifiedRuns == len(group) && len(s.failures) == 0:
			s.verified = "yes"
		default:
			s.verified = fmt.Sprintf("NO %d/%d", s.verifiedRuns, len(group))
		}
		if r.mode == modeNone && len(s.failures) > 0 {
			s.verified = "FAILED"
		}
		out = append(out, s)
	}
	return out
}

// find is the summary of (mode, tables), if any.
func find(ss []summary, mode string, tables int) (summary, bool) {
	for _, s := range ss {
		if s.mode == mode && s.tables == tables {
			return s, true
		}
	}
	return summary{}, false
}

// num formats a measured figure with the given precision, "-" otherwise.
func num(x float64, prec int) string {
	if x < 0 {
		return "-"
	}
	return fmt.Sprintf("%.*f", prec, x)
}

// render is the table of medians, the goals and the failures.
func render(ss []summary) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-11s %6s %13s %8s %10s %8s %10s %9s %9s %10s %9s %9s %12s  %s\n", "replication", "tables", "source rows/s",
		"vs none", "10s median", "vs none", "lag p50ms", "p99 ms", "max ms", "catch-up s", "start s", "drain s", "drain rows/s", "verified")
	for _, s := range ss {
		ratio, windowRatio := "-", "-"
		if base, ok := find(ss, modeNone, s.tables); ok {
			ratio, windowRatio = ofBase(s.rowsPerSec, base.rowsPerSec), ofBase(s.windowRate, base.windowRate)
		}
		fmt.Fprintf(&b, "%-11s %6d %13s %8s %10s %8s %10s %9s %9s %10s %9s %9s %12s  %s\n", s.mode, s.tables, num(s.rowsPerSec, 0), ratio,
			num(s.windowRate, 0), windowRatio, num(s.lagP50, 0), num(s.lagP99, 0), num(s.lagMax, 0), num(s.catchUp, 1), num(s.startUp, 1),
			num(s.drain, 1), num(s.drainRate, 0), s.verified)
	}
	b.WriteString("\nCPU per row (µs)     main load: source target changefeed    all | drain: source target changefeed    all\n")
	for _, s := range ss {
		fmt.Fprintf(&b, "%-11s %6d %16s %6s %10s %6s | %13s %6s %10s %6s\n", s.mode, s.tables,
			num(s.cpuLoad[0], 0), num(s.cpuLoad[1], 0), num(s.cpuLoad[2], 0), num(s.cpuLoad[3], 0),
			num(s.cpuDrain[0], 0), num(s.cpuDrain[1], 0), num(s.cpuDrain[2], 0), num(s.cpuDrain[3], 0))
	}
	goals := goalLines(ss)
	if len(goals) > 0 {
		b.WriteString("\n")
		for _, g := range goals {
			b.WriteString(g + "\n")
		}
	}
	for _, s := range ss {
		for _, f := range s.failures {
			fmt.Fprintf(&b, "FAILED %s/%d: %s\n", s.mode, s.tables, f)
		}
	}
	return b.String()
}

// ofBase is x as a fraction of the baseline's base, "-" when either was
// not measured.
func ofBase(x, base float64) string {
	if x < 0 || base <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", x/base)
}

func verdict(met bool) string {
	if met {
		return "met"
	}
	return "NOT MET"
}

// goalLines states issue 20's goals against the medians: cdcflow slows
// the source no more than native does, its lag p99 is at most 1 s, it
// drains a backlog at least as fast as native at 1000 tables (or the
// largest table count run), and every run verified.
func goalLines(ss []summary) []string {
	var out []string
	var counts []int
	for _, s := range ss {
		if s.mode == modeCDCFlow {
			counts = append(counts, s.tables)
		}
	}
	for _, n := range counts {
		c, _ := find(ss, modeCDCFlow, n)
		nat, okN := find(ss, modeNative, n)
		base, okB := find(ss, modeNone, n)
		if okN && okB && base.rowsPerSec > 0 && c.rowsPerSec >= 0 && nat.rowsPerSec >= 0 {
			out = append(out, fmt.Sprintf("goal %4d tables, source slowed no more than by native: cdcflow %.2f of the baseline, native %.2f: %s",
				n, c.rowsPerSec/base.rowsPerSec, nat.rowsPerSec/base.rowsPerSec, verdict(c.rowsPerSec >= nat.rowsPerSec)))
		}
		// Not the goal's verdict (that is the whole load's rate, above):
		// the same comparison over the median 10 s, for what the whole
		// load's rate mixes in (docs/benchmarks.md).
		if okN && okB && base.windowRate > 0 && c.windowRate >= 0 && nat.windowRate > 0 {
			out = append(out, fmt.Sprintf("     %4d tables, the same by the median 10 s of the load: cdcflow %.2f of the baseline, native %.2f (cdcflow %.2f of native)",
				n, c.windowRate/base.windowRate, nat.windowRate/base.windowRate, c.windowRate/nat.windowRate))
		}
		if c.lagP99 >= 0 {
			out = append(out, fmt.Sprintf("goal %4d tables, lag p99 <= 1 s: cdcflow %s ms: %s", n, num(c.lagP99, 0), verdict(c.lagP99 <= 1000)))
		}
	}
	if len(counts) > 0 {
		n := slices.Max(counts)
		if slices.Contains(counts, 1000) {
			n = 1000
		}
		c, _ := find(ss, modeCDCFlow, n)
		if nat, ok := find(ss, modeNative, n); ok && c.drainRate >= 0 && nat.drainRate >= 0 {
			out = append(out, fmt.Sprintf("goal %4d tables, backlog drained at least as fast as native: cdcflow %.0f rows/s, native %.0f rows/s: %s",
				n, c.drainRate, nat.drainRate, verdict(c.drainRate >= nat.drainRate)))
		}
	}
	all, bad := 0, []string{}
	for _, s := range ss {
		if s.mode == modeNone {
			continue
		}
		all++
		if s.verified != "yes" {
			bad = append(bad, fmt.Sprintf("%s/%d", s.mode, s.tables))
		}
	}
	if all > 0 {
		line := "goal target equal to source (compare at the end of every run): " + verdict(len(bad) == 0)
		if len(bad) > 0 {
			line += " (" + strings.Join(bad, ", ") + ")"
		}
		out = append(out, line)
	}
	return out
}

// seconds is d in seconds.
func seconds(d time.Duration) float64 { return d.Seconds() }

// Command benchtable reads `go test -bench` output (several -count runs)
// and prints one table of medians per benchmark and metric, then the
// headline ratios of the project, each computed from medians measured in
// the same run.
//
// Usage: go run ./scripts/benchtable bench.out [cdcserver.json]
//
// The optional second file is the one JSON object `cdcserver --json` prints;
// its notify and lag figures are appended to the table.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// benchLine matches "BenchmarkName-2   N   v1 unit1   v2 unit2 ...".
var benchLine = regexp.MustCompile(`^(Benchmark\S+?)(?:-\d+)?\s+\d+\s+(.*)$`)

type samples map[string][]float64 // unit -> values

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(2)
	}
}

func run(args []string, out io.Writer) error {
	if len(args) != 1 && len(args) != 2 {
		return fmt.Errorf("usage: benchtable <go test -bench output file> [cdcserver --json output]")
	}
	f, err := os.Open(args[0])
	if err != nil {
		return err
	}
	defer f.Close()
	results, order, err := parse(f)
	if err != nil {
		return err
	}
	printTable(out, results, order)
	printRatios(out, results)
	if len(args) == 2 {
		return printServer(out, args[1])
	}
	return nil
}

// serverRun is the part of cdcserver's JSON summary the table shows.
type serverRun struct {
	Verified         bool    `json:"verified"`
	Dispatchers      int     `json:"dispatchers"`
	RowsDelivered    int64   `json:"rows_delivered"`
	RowsPerSec       float64 `json:"rows_per_sec"`
	PeakPendingTasks int     `json:"peak_pending_tasks"`
	NotifyNs         struct {
		P50, P99, Max float64
	} `json:"notify_ns"`
	ResolvedLagMs struct {
		P50, P99, Max float64
	} `json:"resolved_lag_ms"`
}

func printServer(out io.Writer, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var r serverRun
	if err := json.Unmarshal(b, &r); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	fmt.Fprintf(out, "\ncdcserver saturation run (%d dispatchers, 1 scan worker, scan channel of 1): verified=%v\n", r.Dispatchers, r.Verified)
	fmt.Fprintf(out, "  notify callback  p50 %.0f ns  p99 %.0f ns  max %.0f ns\n", r.NotifyNs.P50, r.NotifyNs.P99, r.NotifyNs.Max)
	fmt.Fprintf(out, "  resolved-ts lag  p50 %.1f ms  p99 %.1f ms  max %.1f ms\n", r.ResolvedLagMs.P50, r.ResolvedLagMs.P99, r.ResolvedLagMs.Max)
	fmt.Fprintf(out, "  rows delivered %d at %.0f rows/s; peak pending tasks %d\n", r.RowsDelivered, r.RowsPerSec, r.PeakPendingTasks)
	return nil
}

func parse(r io.Reader) (map[string]samples, []string, error) {
	results := map[string]samples{}
	var order []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := benchLine.FindStringSubmatch(strings.TrimSpace(sc.Text()))
		if m == nil {
			continue
		}
		name := m[1]
		fields := strings.Fields(m[2])
		if _, ok := results[name]; !ok {
			results[name] = samples{}
			order = append(order, name)
		}
		for i := 0; i+1 < len(fields); i += 2 {
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				continue
			}
			results[name][fields[i+1]] = append(results[name][fields[i+1]], v)
		}
	}
	return results, order, sc.Err()
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

var unitOrder = []string{"ns/op", "rows/s", "MB/s", "p50-ns", "p999-ns", "B/op", "allocs/op"}

func printTable(out io.Writer, results map[string]samples, order []string) {
	fmt.Fprintf(out, "\n%-70s %12s %14s %9s %8s %9s %10s %9s  runs\n", "benchmark (median)", "ns/op", "rows/s", "MB/s", "p50-ns", "p999-ns", "B/op", "allocs/op")
	for _, name := range order {
		s := results[name]
		fmt.Fprintf(out, "%-70s", name)
		runs := 0
		for _, u := range unitOrder {
			if v, ok := s[u]; ok {
				fmt.Fprintf(out, " %*s", width(u), format(median(v)))
				runs = max(runs, len(v))
			} else {
				fmt.Fprintf(out, " %*s", width(u), "-")
			}
		}
		fmt.Fprintf(out, "  %d\n", runs)
	}
}

func width(u string) int {
	return map[string]int{"ns/op": 12, "rows/s": 14, "MB/s": 9, "p50-ns": 8, "p999-ns": 9, "B/op": 10, "allocs/op": 9}[u]
}

func format(v float64) string {
	switch {
	case v >= 1e6:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	default:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
}

// ratio describes one headline comparison: num/den of a unit's medians.
type ratio struct {
	label, num, den, unit, target string
}

var ratios = []ratio{
	{"notify saturated / idle (ns/op)", "BenchmarkNotifySaturated", "BenchmarkNotifyIdle", "ns/op", "<= 1.5"},
	{"notify 1M / 1k dispatchers, saturated (ns/op)", "BenchmarkNotifyScale/mode=saturated/dispatchers=1000000", "BenchmarkNotifyScale/mode=saturated/dispatchers=1000", "ns/op", "<= 2"},
	{"notify 1M / 1k dispatchers, workers running (ns/op)", "BenchmarkNotifyScale/mode=idle/dispatchers=1000000", "BenchmarkNotifyScale/mode=idle/dispatchers=1000", "ns/op", "<= 2"},
	{"pending set hot key (live, parallel) / blocking chan (parallel)", "BenchmarkAdd/keys=1/producers=parallel/consumer=live", "BenchmarkBaselineBlockingChannel/producers=parallel", "ns/op", "< 1"},
	{"pending set 100k keys (live, single) / blocking chan (single)", "BenchmarkAdd/keys=100000/producers=single/consumer=live", "BenchmarkBaselineBlockingChannel/producers=single", "ns/op", "-"},
	{"scheduler scan, 1 dispatcher / raw pebble scan (rows/s)", "BenchmarkScanThroughput/dispatchers=1", "BenchmarkRawPebbleScanReference", "rows/s", ">= 0.5"},
	{"scheduler scan, 2 dispatchers / raw pebble scan (rows/s)", "BenchmarkScanThroughput/dispatchers=2", "BenchmarkRawPebbleScanReference", "rows/s", ">= 0.5"},
	{"store scan / raw pebble scan (rows/s)", "BenchmarkStoreScan", "BenchmarkRawPebbleScan", "rows/s", ">= 0.7"},
}

func printRatios(out io.Writer, results map[string]samples) {
	fmt.Fprintf(out, "\n%-66s %10s %8s\n", "headline ratio (medians, same run)", "ratio", "target")
	for _, r := range ratios {
		n, okN := results[r.num][r.unit]
		d, okD := results[r.den][r.unit]
		if !okN || !okD || median(d) == 0 {
			fmt.Fprintf(out, "%-66s %10s %8s\n", r.label, "n/a", r.target)
			continue
		}
		fmt.Fprintf(out, "%-66s %10.2f %8s\n", r.label, median(n)/median(d), r.target)
	}
	if w, ok := results["BenchmarkStoreWrite"]; ok {
		fmt.Fprintf(out, "%-66s %10s\n", "store write rows/s", format(median(w["rows/s"])))
		fmt.Fprintf(out, "%-66s %10s\n", "store write MB/s", format(median(w["MB/s"])))
	}
}

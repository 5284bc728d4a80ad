// Command pgbench measures `cdcserver serve` side by side with PostgreSQL's
// native logical replication (a publication FOR ALL TABLES and a
// subscription, PostgreSQL 15 to PostgreSQL 15) under the same load, on
// fresh servers (internal/pgtest, fsync on) for each configuration:
//
//   - none: the load alone, no replication (the baseline);
//   - native: CREATE SUBSCRIPTION on the target, the tables created there
//     first;
//   - cdcflow: a `cdcserver serve --sink-workers 4` child process.
//
// The load: -rows rows in 4-row transactions (75% inserts, 20% updates,
// 5% deletes) from -clients pgx connections, flat out, over -tables
// tables, plus a probe row (id, clock_timestamp()) every 100 ms. For each
// configuration it reports the source's commit rows/s, the lag (now minus
// the newest probe the target holds, polled every 100 ms while the load
// runs), the catch-up after the load (until the target holds a fence
// row in every table and the last probe), the drain of a -backlog rows
// backlog loaded while the changefeed was stopped (native: ALTER
// SUBSCRIPTION DISABLE/ENABLE; cdcflow: SIGTERM, start again), and
// whether `cdcserver compare` found the tables equal at the end.
//
// Usage: go run ./scripts/pgbench [-update] [-runs N] [-rows N] ...
//
// It prints a table of medians over -runs runs; -update also writes it
// into docs/benchmarks.md between <!-- pgbench:table --> and
// <!-- /pgbench:table -->. It is never run by `make test`.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cdcflow/eventservice/internal/docblock"
)

type options struct {
	rows, backlog, clients, runs int
	tables                       []int
	modes                        []string
	update                       bool
	doc                          string
	timeout                      time.Duration
	profileDir, logs             string
	baseline                     string // another build's cdcserver, for modeBaseline
	seed                         uint64
	serveArgs                    []string // more flags for every cdcserver serve
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "pgbench: %v\n", err)
		stop()
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o options
	fs := flag.NewFlagSet("pgbench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.rows, "rows", 1_000_000, "rows of the main load (in 4-row transactions)")
	fs.IntVar(&o.backlog, "backlog", 300_000, "rows loaded while the changefeed is stopped (0: no backlog phase)")
	fs.IntVar(&o.clients, "clients", 8, "load connections")
	fs.IntVar(&o.runs, "runs", 1, "runs of each configuration (the table shows medians)")
	tables := fs.String("tables", "100,1000", "comma-separated table counts")
	modes := fs.String("modes", "none,native,cdcflow", "comma-separated configurations: none (no replication), native, cdcflow")
	fs.BoolVar(&o.update, "update", false, "also write the table into -doc")
	fs.StringVar(&o.doc, "doc", "docs/benchmarks.md", "the document whose <!-- pgbench:table --> block -update rewrites")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Minute, "longest wait for a changefeed to stream, catch up or drain")
	fs.StringVar(&o.profileDir, "profile", "", "directory for CPU profiles of cdcserver serve: 20 s of each main load, 5 s of each drain (empty: none)")
	fs.StringVar(&o.logs, "logs", "", "directory that keeps cdcserver serve's logs (empty: removed with the run's temporary directory)")
	fs.Uint64Var(&o.seed, "seed", 1, "seed of the load's random streams")
	fs.StringVar(&o.baseline, "baseline", "", "a cdcserver binary of another build, run as mode "+modeBaseline+" (an A/B in one sitting: -modes cdcflow,"+modeBaseline+" -runs 3)")
	serveArgs := fs.String("serve-args", "--max-procs 1", "more flags for every cdcserver serve, both builds' (space-separated); the default keeps serve to one core, as native's apply worker is, on cores it shares with both servers")
	if err := fs.Parse(args); err != nil {
		return err
	}
	o.serveArgs = strings.Fields(*serveArgs)
	var err error
	if o.tables, err = parseInts(*tables); err != nil {
		return fmt.Errorf("-tables: %w", err)
	}
	o.modes = strings.Split(*modes, ",")
	for _, m := range o.modes {
		if m != modeNone && m != modeNative && m != modeCDCFlow && m != modeBaseline {
			return fmt.Errorf("-modes: unknown %q", m)
		}
		if m == modeBaseline && o.baseline == "" {
			return fmt.Errorf("-modes %s needs -baseline", modeBaseline)
		}
	}
	if o.rows < rowsPerTxn || o.clients < 1 || o.runs < 1 || o.backlog < 0 {
		return fmt.Errorf("-rows >= %d, -clients >= 1, -runs >= 1 and -backlog >= 0 are required", rowsPerTxn)
	}
	for _, d := range []string{o.profileDir, o.logs} {
		if d != "" {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return err
			}
		}
	}
	started := time.Now()
	tmp, err := os.MkdirTemp("", "pgbench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	b := &bench{opts: o, tmp: tmp, bin: filepath.Join(tmp, "cdcserver"), logf: func(format string, args ...any) {
		fmt.Fprintf(stderr, "%s pgbench: %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
	}}
	// cdcserver serves cdcflow and compares for both changefeeds.
	build := exec.CommandContext(ctx, "go", "build", "-o", b.bin, "./cmd/cdcserver")
	build.Stdout, build.Stderr = stderr, stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("go build ./cmd/cdcserver (run pgbench from the module's root): %w", err)
	}
	var results []result
	for r := range o.runs {
		for _, n := range o.tables {
			for _, m := range orderOfRun(o.modes, r) {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				b.logf("run %d/%d: %s, %d tables", r+1, o.runs, m, n)
				results = append(results, b.runConfig(ctx, m, n, r))
			}
		}
	}
	wall := time.Since(started)
	body := header(o, b.version, wall) + "\n" + render(summarize(results))
	fmt.Fprint(stdout, body)
	if !o.update {
		return nil
	}
	stamp := fmt.Sprintf("Generated by `make pgbench` (scripts/pgbench -update) on %s, %s.\n", time.Now().UTC().Format("2006-01-02"), runtime.Version())
	return docblock.Replace(o.doc, "pgbench:table", stamp+"\n```\n"+body+"```\n")
}

// orderOfRun is the order of the modes in run r (from 0): the r-th of
// their permutations in lexicographic order of their places in modes, so
// that run 0 takes them as given and no mode always follows the same one
// (a rotation would: none, native, cdcflow then native, cdcflow, none
// keeps cdcflow after native). What a configuration leaves behind (the
// disk's write-back of the servers it removed) then falls on each mode
// in turn; runs beyond the permutations start over.
func orderOfRun(modes []string, r int) []string {
	n := len(modes)
	perms := 1
	for k := 2; k <= n; k++ {
		perms *= k
	}
	// The r-th permutation by the factorial number system.
	rest := slices.Clone(modes)
	out := make([]string, 0, n)
	idx := r % perms
	for k := n; k >= 1; k-- {
		perms /= k
		i := idx / perms
		idx %= perms
		out = append(out, rest[i])
		rest = slices.Delete(rest, i, i+1)
	}
	return out
}

// header states what was run.
func header(o options, version string, wall time.Duration) string {
	return fmt.Sprintf("PostgreSQL %s -> %s, fsync on, %d cores; %d rows in %d-row transactions (75%% inserts, 20%% updates, 5%% deletes), "+
		"%d clients; backlog %d rows; cdcserver serve %s; medians of %d run(s); wall time %s\n",
		version, version, runtime.NumCPU(), o.rows, rowsPerTxn, o.clients, o.backlog, orDefaults(o.serveArgs), o.runs, wall.Round(time.Second))
}

// orDefaults names serve's extra flags for the header.
func orDefaults(args []string) string {
	if len(args) == 0 {
		return "with its defaults"
	}
	return strings.Join(args, " ")
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("%q: want a positive number", f)
		}
		out = append(out, n)
	}
	return out, nil
}

package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/cmd/cdcserver/app/synthetic"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pebblesink"
	"github.com/cdcflow/eventservice/pkg/upstream"
)

// The crash test re-executes its own binary as the server process.
const (
	envCrashChild = "CDCFLOW_CRASH_CHILD"
	envCrashDir   = "CDCFLOW_CRASH_DIR"
)

// crashConfig is the server both the child and the parent's checks use.
func crashConfig(t *testing.T, dir string) synthetic.Config {
	cfg := serverConfig(t, 200, 4000, scaled(t, 4*time.Second))
	cfg.DDLInterval = 200 * time.Millisecond
	cfg.Seed = 21
	cfg.DurableSink, cfg.DataDir, cfg.JSON = true, dir, true
	return cfg
}

// TestCrashRestart runs the server in a child process whose collector
// applies rows to a durable sink in its data dir (rows and checkpoint in
// one batch, applied idempotently by table, key and commit-ts), kills it
// with SIGKILL at seeded random points (before startup finishes, mid-run,
// late or during the catch-up after the workload's end), checks after each
// kill what the dead process left on disk, restarts it on the same data
// dir, and finally lets one run to completion.
//
// After every kill: each persisted checkpoint is at least the previous
// one, and the sink holds every upstream row at or below its dispatcher's
// checkpoint, each version exactly as the upstream wrote it, per key in
// commit-ts order (rows above a checkpoint may be there too: they were
// persisted with an earlier checkpoint's batch or will be re-applied
// idempotently). At the end the server's own verification and an
// independent read of the sink agree: exactly the upstream's rows, nothing
// missing, nothing applied twice, per-key order kept, and the final run
// applied exactly the rows above the persisted checkpoints (it resumed,
// it did not start over).
func TestCrashRestart(t *testing.T) {
	if os.Getenv(envCrashChild) == "1" {
		runCrashChild(t)
		return
	}
	seed := envUint(t, envCrashSeed, 1)
	t.Logf("crash seed %d (replay with %s=%d)", seed, envCrashSeed, seed)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("FAILED with crash seed %d: replay with %s=%d go test -race -run '^TestCrashRestart$' ./tests/", seed, envCrashSeed, seed)
		}
	})
	rng := rand.New(rand.NewPCG(seed, 0))
	dir := t.TempDir()
	cfg := crashConfig(t, dir)
	s := &scenario{name: "crash and restart", dispatchers: cfg.Tables}
	report(t, s)

	d := cfg.Duration
	between := func(lo, hi time.Duration) time.Duration { return lo + time.Duration(rng.Int64N(int64(hi-lo))) }
	kills := []time.Duration{between(5*time.Millisecond, 60*time.Millisecond)} // before startup finishes
	for range 2 * scale(t) {
		kills = append(kills, between(300*time.Millisecond, d/2)) // mid-run
	}
	kills = append(kills, between(d/2, d+d/2)) // late, or in the catch-up after the end

	var last durableState
	killed := 0
	for i, delay := range kills {
		exited, out := runChild(t, dir, delay)
		how := fmt.Sprintf("SIGKILL after %v", delay)
		if exited {
			how = fmt.Sprintf("ended by itself before its SIGKILL at %v", delay)
		} else {
			killed++
		}
		st := inspectDurable(t, dir, cfg.Tables)
		t.Logf("run %d: %s: %s", i+1, how, st)
		if exited {
			require.Contains(t, out, `"verified":true`)
		}
		requireProgressKept(t, last, st)
		last = st
	}

	exited, out := runChild(t, dir, 0)
	require.True(t, exited)
	sum := parseSummary(t, out)
	st := inspectDurable(t, dir, cfg.Tables)
	t.Logf("final run: %s; summary: %s", st, strings.TrimSpace(out))
	s.rows, s.resets = sum.RowsDelivered, sum.Resets
	s.faults = fmtFaults("%d SIGKILLs (seed %d)", killed, seed)
	require.Positive(t, killed)
	require.True(t, sum.Verified, "problems: %v", sum.Problems)
	require.True(t, sum.Complete)
	require.Zero(t, sum.LostWakeups)
	require.Zero(t, sum.MissingRows)
	require.Zero(t, sum.Duplicates)
	require.Zero(t, sum.OrderViolations)
	require.Zero(t, sum.UnexpectedRows)
	require.Positive(t, sum.RowsUpstream)
	require.Equal(t, sum.RowsUpstream, sum.RowsDelivered)
	require.Equal(t, int64(st.rows), sum.RowsDelivered)
	require.Equal(t, uint64(st.rows), st.wantRows, "the sink holds exactly the upstream's rows")
	require.Zero(t, sum.Resets)
	require.Equal(t, last.rowsAbove, sum.RowsApplied, "the final run resumed from the persisted checkpoints")
	require.LessOrEqual(t, sum.PeakPendingPrep, cfg.Tables, "queues bounded by the dispatchers")
}

// runCrashChild is the child: the whole server on the durable data dir.
func runCrashChild(t *testing.T) {
	cfg := crashConfig(t, os.Getenv(envCrashDir))
	sum, err := synthetic.Run(context.Background(), cfg, os.Stdout, os.Stderr)
	switch {
	case err != nil:
		fmt.Fprintln(os.Stderr, "crash child:", err)
		os.Exit(2)
	case !sum.Verified:
		os.Exit(1)
	}
	os.Exit(0)
}

// runChild starts the child on dir and SIGKILLs it after killAfter (zero:
// let it finish). It reports whether the child exited by itself, and its
// stdout; a child that exits by itself must exit 0.
func runChild(t *testing.T, dir string, killAfter time.Duration) (bool, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), scaled(t, 5*time.Minute))
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestCrashRestart$", "-test.v=false")
	cmd.Env = append(os.Environ(), envCrashChild+"=1", envCrashDir+"="+dir)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Start())
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	var kill <-chan time.Time
	if killAfter > 0 {
		timer := time.NewTimer(killAfter)
		defer timer.Stop()
		kill = timer.C
	}
	select {
	case err := <-done:
		require.NoError(t, err, "child failed:\nstdout: %s\nstderr: %s", stdout.String(), tail(stderr.String(), 4000))
		return true, stdout.String()
	case <-kill:
		// SIGKILL: no cleanup runs. The child may have ended on its own
		// just now; Wait tells which.
		if err := cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
			t.Fatalf("SIGKILL: %v", err)
		}
		err := <-done
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatalf("waiting for the killed child: %v", err)
		}
		if err == nil {
			return true, stdout.String() // it finished just before the signal
		}
		return false, stdout.String()
	}
}

func parseSummary(t *testing.T, out string) synthetic.Summary {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var sum synthetic.Summary
	require.NoError(t, json.Unmarshal([]byte(lines[len(lines)-1]), &sum), "stdout: %s", out)
	return sum
}

// workloadFile is the part of the server's workload.json the checks need
// to rebuild the same generator.
type workloadFile struct {
	Seed        uint64    `json:"seed"`
	Tables      int       `json:"tables"`
	Rate        int       `json:"rate"`
	TxnRows     int       `json:"txn_rows"`
	RowBytes    int       `json:"row_bytes"`
	HotFraction float64   `json:"hot_fraction"`
	StartTs     common.Ts `json:"start_ts"`
	EndTs       common.Ts `json:"end_ts"`
}

// durableState is what a dead child left in its data dir.
type durableState struct {
	started     bool // the workload and the sink exist
	checkpoints []common.Ts
	rows        int // versions stored
	// wantRows is the upstream's rows at or below the checkpoints;
	// rowsAbove those above them, up to the workload's end.
	wantRows, rowsAbove uint64
}

func (s durableState) String() string {
	if !s.started {
		return "nothing persisted yet"
	}
	var done int
	for _, c := range s.checkpoints {
		if c > 0 {
			done++
		}
	}
	return fmt.Sprintf("%d dispatchers checkpointed, %d versions stored, %d upstream rows at or below the checkpoints, %d above",
		done, s.rows, s.wantRows, s.rowsAbove)
}

// inspectDurable opens the sink a child left and checks it against the
// upstream's rows (see TestCrashRestart).
func inspectDurable(t *testing.T, dir string, tables int) durableState {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "workload.json"))
	if errors.Is(err, os.ErrNotExist) {
		return durableState{}
	}
	require.NoError(t, err)
	var w workloadFile
	require.NoError(t, json.Unmarshal(b, &w))
	if _, err := os.Stat(filepath.Join(dir, "sink")); errors.Is(err, os.ErrNotExist) {
		return durableState{}
	}
	gen, err := upstream.NewGenerator(upstream.GeneratorOptions{Tables: w.Tables, RowsPerSec: w.Rate, TxnRows: w.TxnRows,
		RowBytes: w.RowBytes, HotFraction: w.HotFraction, Seed: w.Seed, StartTs: w.StartTs, EndTs: w.EndTs})
	require.NoError(t, err)
	defer gen.Close()
	sink, err := pebblesink.Open(filepath.Join(dir, "sink"))
	require.NoError(t, err)
	defer func() { require.NoError(t, sink.Close()) }()

	st := durableState{started: true, checkpoints: make([]common.Ts, tables)}
	for table := 1; table <= tables; table++ {
		ckpt, err := sink.CheckpointOf(common.DispatcherID{Hi: 1, Lo: uint64(table)})
		require.NoError(t, err)
		st.checkpoints[table-1] = ckpt
		versions, err := sink.Versions(int64(table))
		require.NoError(t, err)
		st.rows += len(versions)
		upto := max(ckpt, w.StartTs)
		want := gen.Rows(int64(table), w.StartTs, upto)
		st.wantRows += uint64(len(want))
		st.rowsAbove += uint64(gen.RowCount(int64(table), upto, w.EndTs))
		requireVersions(t, int64(table), ckpt, gen.Rows(int64(table), w.StartTs, w.EndTs), want, versions)
	}
	return st
}

// requireVersions checks one table's stored versions: each is an upstream
// row with its exact content, per key applied in commit-ts order, and every
// upstream row at or below the checkpoint is there.
func requireVersions(t *testing.T, table int64, ckpt common.Ts, all, below []common.Row, versions []pebblesink.Version) {
	t.Helper()
	type vk struct {
		key string
		ts  common.Ts
	}
	upstreamRows := make(map[vk]*common.Row, len(all))
	for i := range all {
		upstreamRows[vk{string(all[i].Key), all[i].CommitTs}] = &all[i]
	}
	stored := make(map[vk]bool, len(versions))
	for i, v := range versions {
		k := vk{string(v.Key), v.CommitTs}
		r, ok := upstreamRows[k]
		require.True(t, ok, "table %d: stored version %x@%v is not an upstream row", table, v.Key, v.CommitTs)
		require.Equal(t, r.Op, v.Op, "table %d: version %x@%v", table, v.Key, v.CommitTs)
		require.True(t, bytes.Equal(r.Value, v.Value), "table %d: version %x@%v differs", table, v.Key, v.CommitTs)
		require.False(t, stored[k], "table %d: version %x@%v stored twice", table, v.Key, v.CommitTs)
		stored[k] = true
		if i > 0 && bytes.Equal(versions[i-1].Key, v.Key) {
			require.Less(t, versions[i-1].Seq, v.Seq, "table %d: key %x applied out of commit-ts order", table, v.Key)
		}
	}
	for _, r := range below {
		require.True(t, stored[vk{string(r.Key), r.CommitTs}],
			"table %d: row %x@%v at or below the persisted checkpoint %v is missing", table, r.Key, r.CommitTs, ckpt)
	}
}

// requireProgressKept checks that no persisted checkpoint went back.
func requireProgressKept(t *testing.T, before, after durableState) {
	t.Helper()
	if !before.started {
		return
	}
	require.True(t, after.started)
	for i := range before.checkpoints {
		require.GreaterOrEqual(t, after.checkpoints[i], before.checkpoints[i], "dispatcher of table %d: persisted checkpoint went back", i+1)
	}
}

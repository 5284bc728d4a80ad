package tests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/cmd/cdcserver/app/replicate"
	"github.com/cdcflow/eventservice/internal/linewatch"
	"github.com/cdcflow/eventservice/internal/pgtest"
	"github.com/cdcflow/eventservice/internal/testwait"
)

func startServe(t *testing.T, src, dst *pgtest.Server, dataDir string) *childProcess {
	t.Helper()
	cmd := exec.Command(buildCDCServer(t), "serve", "--source", src.DSN, "--sink", dst.DSN, "--data-dir", dataDir,
		"--metrics-addr", "127.0.0.1:0", "--pprof-addr", "", "--log-level", "warn", "--progress-interval", "0")
	return startChild(t, cmd, linewatch.New(`^serve: replicating (\d+) tables`))
}

// pgWorkload writes to tables t1..tN until stopped: inserts, updates of a
// small column or of the key (the TOASTed body is left unchanged) and
// deletes, in transactions of a few rows.
type pgWorkload struct {
	pool   *pgxpool.Pool
	tables int
	stop   chan struct{}
	wg     sync.WaitGroup
	mu     sync.Mutex
	err    error
	txns   int
}

func startWorkload(t *testing.T, dsn string, tables, workers int) *pgWorkload {
	pool, err := pgxpool.New(context.Background(), dsn)
	require.NoError(t, err)
	w := &pgWorkload{pool: pool, tables: tables, stop: make(chan struct{})}
	for i := range workers {
		w.wg.Go(func() { w.run(uint64(i)) })
	}
	return w
}

func (w *pgWorkload) run(seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 42))
	ctx := context.Background()
	next := int(seed+1) * 1_000_000
	for {
		select {
		case <-w.stop:
			return
		default:
		}
		tx, err := w.pool.Begin(ctx)
		if err != nil {
			w.fail(err)
			return
		}
		for range 4 {
			tbl := fmt.Sprintf("t%d", 1+rng.IntN(w.tables))
			switch p := rng.IntN(100); {
			case p < 65:
				next++
				_, err = tx.Exec(ctx, "INSERT INTO "+tbl+" VALUES ($1, 0, $2)", next, fmt.Sprintf("%x", rng.Uint64()))
			case p < 70:
				// A new key, the body left as it was: a move, whose
				// TOASTed body (the first rows') only the old row holds.
				next++
				_, err = tx.Exec(ctx, "UPDATE "+tbl+" SET id = $1 WHERE id = (SELECT id FROM "+tbl+" ORDER BY random() LIMIT 1)", next)
			case p < 90:
				_, err = tx.Exec(ctx, "UPDATE "+tbl+" SET n = n + 1 WHERE id = (SELECT id FROM "+tbl+" ORDER BY random() LIMIT 1)")
			default:
				_, err = tx.Exec(ctx, "DELETE FROM "+tbl+" WHERE id = (SELECT id FROM "+tbl+" ORDER BY random() LIMIT 1)")
			}
			if err != nil {
				break
			}
		}
		if err == nil {
			err = tx.Commit(ctx)
		} else {
			_ = tx.Rollback(ctx)
		}
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "40P01" {
			continue // two workers' updates deadlocked: the server rolled one back
		}
		if err != nil {
			w.fail(err)
			return
		}
		w.mu.Lock()
		w.txns++
		w.mu.Unlock()
	}
}

func (w *pgWorkload) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
	}
}

func (w *pgWorkload) finish(t *testing.T) int {
	close(w.stop)
	w.wg.Wait()
	w.pool.Close()
	require.NoError(t, w.err, "the workload")
	return w.txns
}

// startedOver is what serve logs when it starts a changefeed over.
const startedOver = "the initial snapshot did not complete"

// waitReplicating waits for serve's "replicating" line (it has fenced out
// the processes before it and decided to resume or start over) and
// returns the target's checkpoint progress then.
func waitReplicating(t *testing.T, proc *childProcess, dst *pgtest.Server) int64 {
	t.Helper()
	select {
	case <-proc.stderr.Matches():
	case <-proc.exited:
		t.Fatalf("serve exited: %v\n%s", proc.err, tail(proc.stderr.String(), 4000))
	case <-time.After(scaled(t, 2*time.Minute)):
		t.Fatalf("serve never started replicating:\n%s", tail(proc.stderr.String(), 4000))
	}
	return checkpointProgress(t, dst)
}

// snapshotRecorded reports whether serve recorded its snapshot as done.
func snapshotRecorded(t *testing.T, dst *pgtest.Server) bool {
	conn, err := pgx.Connect(context.Background(), dst.DSN)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var n int
	if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM cdcflow.state WHERE key LIKE 'snapshot-done:%'").Scan(&n); err != nil {
		return false // not created yet
	}
	return n > 0
}

// checkpointProgress returns the highest checkpoint the target holds.
func checkpointProgress(t *testing.T, dst *pgtest.Server) int64 {
	conn, err := pgx.Connect(context.Background(), dst.DSN)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var ts int64
	err = conn.QueryRow(context.Background(), "SELECT coalesce(max(ts), 0) FROM cdcflow.checkpoints").Scan(&ts)
	if err != nil {
		return 0 // not created yet
	}
	return ts
}

// confirmedFlush returns the slot's confirmed flush LSN.
func confirmedFlush(t *testing.T, src *pgtest.Server) pglogrepl.LSN {
	conn, err := pgx.Connect(context.Background(), src.DSN)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var s string
	require.NoError(t, conn.QueryRow(context.Background(), "SELECT coalesce(confirmed_flush_lsn::text, '0/0') FROM pg_replication_slots").Scan(&s))
	lsn, err := pglogrepl.ParseLSN(s)
	require.NoError(t, err)
	return lsn
}

// waitTimed waits for cond (a database's state) as testwait.Within does
// and logs how long it took.
func waitTimed(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	start := time.Now()
	testwait.Within(t, d, what, cond)
	t.Logf("%s: after %.1f s", what, time.Since(start).Seconds())
}

// A real changefeed under load, 100 tables: `cdcserver serve` is killed
// with SIGKILL mid-stream three times and started again, the replication
// connection is terminated by the server, and the target is down for 5 s
// (the slot keeps the WAL meanwhile; its confirmed flush moves on once
// the target caught up). At the end `compare` finds every table equal.
func TestServeSurvivesKillsAndOutages(t *testing.T) {
	src := pgtest.StartWith(t, pgtest.Options{Logical: true, Settings: []string{"max_connections=100"}})
	dst := pgtest.StartWith(t, pgtest.Options{Settings: []string{"max_connections=100"}})
	conn, err := pgx.Connect(context.Background(), src.DSN)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	const tables = 100
	for i := 1; i <= tables; i++ {
		_, err := conn.Exec(context.Background(), fmt.Sprintf(`CREATE TABLE t%d (id int PRIMARY KEY, n int, body text);
ALTER TABLE t%d ALTER COLUMN body SET STORAGE EXTERNAL;
INSERT INTO t%d SELECT g, 0, repeat(md5(g::text), 100) FROM generate_series(1, 20) g`, i, i, i))
		require.NoError(t, err)
	}
	dataDir := t.TempDir()
	work := startWorkload(t, src.DSN, tables, 2)
	defer func() {
		if work != nil {
			work.finish(t)
		}
	}()

	// Three kills, each once the target's checkpoints moved since the
	// process started: the first most likely while the snapshot is
	// copied (the next run starts over), the others once the snapshot
	// is recorded as done, so that the runs after them resume from the
	// checkpoints (checked: they do not start over). A killed process may
	// leave a transaction on its way to commit; the next one's fence waits
	// for it.
	var killedLogs bytes.Buffer
	for kill := range 3 {
		proc := startServe(t, src, dst, dataDir)
		base := waitReplicating(t, proc, dst)
		if kill > 0 {
			waitTimed(t, fmt.Sprintf("the snapshot recorded before kill %d", kill+1), scaled(t, 2*time.Minute), func() bool {
				return snapshotRecorded(t, dst)
			})
		}
		waitTimed(t, fmt.Sprintf("progress before kill %d", kill+1), scaled(t, 2*time.Minute), func() bool {
			return checkpointProgress(t, dst) > base
		})
		if kill > 1 {
			require.NotContains(t, proc.stderr.String(), startedOver, "run %d resumed", kill+1)
		}
		require.NoError(t, proc.cmd.Process.Signal(syscall.SIGKILL))
		_ = proc.wait() // SIGKILLed: not a clean exit
		fmt.Fprintf(&killedLogs, "--- run %d\n%s", kill+1, tail(proc.stderr.String(), 4000))
	}

	proc := startServe(t, src, dst, dataDir)
	base := waitReplicating(t, proc, dst)
	waitTimed(t, "progress after the kills", scaled(t, 2*time.Minute), func() bool { return checkpointProgress(t, dst) > base })
	require.NotContains(t, proc.stderr.String(), startedOver, "the run after the kills resumed")

	// The replication connection terminated by the source.
	_, err = conn.Exec(context.Background(), "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE active_pid IS NOT NULL")
	require.NoError(t, err)
	base = checkpointProgress(t, dst)
	waitTimed(t, "progress after the terminated connection", scaled(t, 2*time.Minute), func() bool { return checkpointProgress(t, dst) > base })

	// The target down for 5 s: the slot holds its position meanwhile.
	require.NoError(t, dst.Stop())
	held := confirmedFlush(t, src)
	time.Sleep(5 * time.Second) // the outage's length, not synchronisation
	require.Equal(t, held, confirmedFlush(t, src), "the slot keeps the WAL while the target is down")
	require.NoError(t, dst.Restart())
	waitTimed(t, "the slot moving on after the target caught up", scaled(t, 2*time.Minute), func() bool { return confirmedFlush(t, src) > held })

	w := work
	work = nil
	txns := w.finish(t)
	t.Logf("workload: %d transactions", txns)
	require.Positive(t, txns)
	var out bytes.Buffer
	var cmpErr error
	start := time.Now()
	if !testwait.Until(scaled(t, 3*time.Minute), func() bool {
		out.Reset()
		cmpErr = replicate.Compare(context.Background(), src.DSN, dst.DSN, "cdcflow", &out)
		return cmpErr == nil
	}) {
		t.Fatalf("the target never equalled the source: %v\n%s\nserve's log:\n%s\nthe killed runs' logs:\n%s",
			cmpErr, differing(out.String()), tail(proc.stderr.String(), 8000), tail(killedLogs.String(), 8000))
	}
	t.Logf("the target equals the source: after %.1f s", time.Since(start).Seconds())
	require.NoError(t, proc.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, proc.wait(), "a clean stop exits 0: %s", tail(proc.stderr.String(), 2000))
}

// differing keeps compare's lines of tables that differ (all 100 lines
// would hide them).
func differing(report string) string {
	var b strings.Builder
	for _, line := range strings.Split(report, "\n") {
		if strings.HasSuffix(line, "DIFFERENT") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

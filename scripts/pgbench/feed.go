package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcflow/eventservice/internal/pgtest"
	"github.com/cdcflow/eventservice/internal/proccpu"
)

// feed is a changefeed from the source to the target.
type feed interface {
	// start starts it the first time (publication, slot, subscription or
	// process); the caller waits for a probe to know it streams.
	start(ctx context.Context) error
	// pause stops it, keeping its slot (the source keeps the WAL).
	pause(ctx context.Context) error
	// resume starts it again after pause.
	resume(ctx context.Context) error
	// check reports a changefeed that died by itself.
	check() error
	// close stops it for good.
	close() error
	// publication is the publication compare reads the tables of.
	publication() string
}

// exec runs sql on dsn.
func execSQL(ctx context.Context, dsn, sql string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

// nativeFeed is a PostgreSQL publication FOR ALL TABLES and a subscription
// on the target (its default apply worker: one, synchronous_commit off).
type nativeFeed struct {
	src, dst *pgtest.Server
	tables   int
}

const nativeName = "pgbench_native"

func (f *nativeFeed) publication() string { return nativeName }

func (f *nativeFeed) start(ctx context.Context) error {
	if err := execSQL(ctx, f.src.DSN, "CREATE PUBLICATION "+nativeName+" FOR ALL TABLES"); err != nil {
		return fmt.Errorf("publication: %w", err)
	}
	if err := createSchema(ctx, f.dst.DSN, f.tables); err != nil {
		return fmt.Errorf("target tables: %w", err)
	}
	host, port, _ := net.SplitHostPort(f.src.Addr)
	// No rows exist yet, so there is nothing to copy (copy_data would run
	// a table sync worker per table for nothing).
	sql := fmt.Sprintf("CREATE SUBSCRIPTION %s CONNECTION 'host=%s port=%s user=postgres dbname=postgres sslmode=disable' PUBLICATION %s WITH (copy_data = false)",
		nativeName, host, port, nativeName)
	if err := execSQL(ctx, f.dst.DSN, sql); err != nil {
		return fmt.Errorf("subscription: %w", err)
	}
	return nil
}

func (f *nativeFeed) pause(ctx context.Context) error {
	if err := execSQL(ctx, f.dst.DSN, "ALTER SUBSCRIPTION "+nativeName+" DISABLE"); err != nil {
		return err
	}
	// Wait until the apply worker is gone and the slot released.
	deadline := time.Now().Add(time.Minute)
	for {
		var workers, active int
		err := queryInt(ctx, f.dst.DSN, "SELECT count(*) FROM pg_stat_subscription WHERE subname = '"+nativeName+"' AND pid IS NOT NULL", &workers)
		if err == nil {
			err = queryInt(ctx, f.src.DSN, "SELECT count(*) FROM pg_replication_slots WHERE slot_name = '"+nativeName+"' AND active", &active)
		}
		if err != nil {
			return err
		}
		if workers == 0 && active == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the subscription still runs a minute after DISABLE (%d workers, %d active slots)", workers, active)
		}
		time.Sleep(50 * time.Millisecond) // polling the servers' state with a deadline
	}
}

func (f *nativeFeed) resume(ctx context.Context) error {
	return execSQL(ctx, f.dst.DSN, "ALTER SUBSCRIPTION "+nativeName+" ENABLE")
}

func (f *nativeFeed) check() error { return nil }
func (f *nativeFeed) close() error { return nil }

func queryInt(ctx context.Context, dsn, sql string, v *int) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(ctx, sql).Scan(v)
}

// cdcflowFeed is a `cdcserver serve` child process (publication "cdcflow"
// and slot "cdcflow", created by serve; --sink-workers 4; the default
// data-dir, a temporary directory).
type cdcflowFeed struct {
	bin       string
	src, dst  string
	logDir    string
	tables    int
	profile   bool // serve pprof on a known port
	pprof     string
	cmd       *exec.Cmd
	done      chan error
	starts    int
	logs      []string
	cpu       time.Duration // CPU time of the processes that have exited
	maxRSS    int64         // the largest peak RSS of those, in bytes
	stopping  bool
	extraArgs []string // -serve-args
}

func (f *cdcflowFeed) publication() string { return "cdcflow" }

func (f *cdcflowFeed) start(ctx context.Context) error { return f.resume(ctx) }

func (f *cdcflowFeed) resume(context.Context) error {
	f.starts++
	logPath := filepath.Join(f.logDir, fmt.Sprintf("serve-%d-tables-%d.log", f.tables, f.starts))
	log, err := os.Create(logPath)
	if err != nil {
		return err
	}
	args := []string{"serve", "--source", f.src, "--sink", f.dst, "--sink-workers", "4", "--metrics-addr", "127.0.0.1:0"}
	args = append(args, f.extraArgs...)
	if f.profile {
		port, err := freePort()
		if err != nil {
			return err
		}
		f.pprof = fmt.Sprintf("127.0.0.1:%d", port)
		args = append(args, "--pprof-addr", f.pprof)
	}
	f.cmd = exec.Command(f.bin, args...)
	f.cmd.Stdout, f.cmd.Stderr = log, log
	if err := f.cmd.Start(); err != nil {
		log.Close()
		return err
	}
	f.logs = append(f.logs, logPath)
	f.done = make(chan error, 1)
	f.stopping = false
	cmd := f.cmd
	go func() {
		err := cmd.Wait()
		log.Close()
		f.done <- err
	}()
	return nil
}

// check: serve must not exit while it should be running.
func (f *cdcflowFeed) check() error {
	if f.cmd == nil || f.stopping {
		return nil
	}
	select {
	case err := <-f.done:
		f.done <- err
		return fmt.Errorf("cdcserver serve exited by itself (%v); its log: %s\n%s", err, f.logs[len(f.logs)-1], tail(f.logs[len(f.logs)-1], 2000))
	default:
		return nil
	}
}

// pause sends SIGTERM and waits for a clean exit (status 0).
func (f *cdcflowFeed) pause(context.Context) error {
	if f.cmd == nil {
		return nil
	}
	if err := f.check(); err != nil {
		return err
	}
	f.stopping = true
	_ = f.cmd.Process.Signal(syscall.SIGTERM)
	var err error
	select {
	case err = <-f.done:
	case <-time.After(90 * time.Second):
		_ = f.cmd.Process.Kill()
		err = errors.Join(errors.New("no exit 90 s after SIGTERM: killed"), <-f.done)
	}
	if ps := f.cmd.ProcessState; ps != nil {
		f.cpu += ps.UserTime() + ps.SystemTime()
		if ru, ok := ps.SysUsage().(*syscall.Rusage); ok {
			f.maxRSS = max(f.maxRSS, ru.Maxrss<<10) // Linux reports KiB
		}
	}
	f.cmd = nil
	if err != nil {
		return fmt.Errorf("cdcserver serve after SIGTERM: %w; its log: %s\n%s", err, f.logs[len(f.logs)-1], tail(f.logs[len(f.logs)-1], 2000))
	}
	return nil
}

func (f *cdcflowFeed) close() error { return f.pause(context.Background()) }

// cpuTime is the CPU time serve has used over all its starts so far: the
// exited processes' and the running one's from /proc (read between
// start/resume and pause, on the goroutine that calls them).
func (f *cdcflowFeed) cpuTime() (time.Duration, error) {
	total := f.cpu
	if f.cmd != nil {
		st, err := proccpu.Read(f.cmd.Process.Pid)
		if err != nil {
			return 0, err
		}
		total += st.Self + st.Reaped
	}
	return total, nil
}

// cpuProfile fetches a CPU profile of the running serve process.
func (f *cdcflowFeed) cpuProfile(ctx context.Context, d time.Duration, path string) error {
	if f.pprof == "" {
		return errors.New("no pprof address")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", f.pprof, int(d.Seconds())), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("pprof: %s", resp.Status)
	}
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, resp.Body); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// tail is the last n bytes of a file.
func tail(path string, n int64) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if int64(len(b)) > n {
		b = b[int64(len(b))-n:]
	}
	return string(b)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcflow/eventservice/internal/pgtest"
)

// Fence ids: the main load's and the backlog's (load ids are positive).
const (
	fenceMain    = -1
	fenceBacklog = -2
)

// bench is what every run shares.
type bench struct {
	opts    options
	bin     string // cdcserver
	tmp     string
	logf    func(format string, args ...any)
	version string // the servers' PostgreSQL version
}

// serverSettings: room for 8 clients, the probe, the samplers and either
// changefeed's connections.
var serverSettings = []string{"max_connections=100"}

// runConfig runs one configuration on fresh servers: the main load (lag
// sampled), the catch-up, the backlog with the changefeed stopped and its
// drain, then compare. What fails is recorded in the result, not hidden.
func (b *bench) runConfig(ctx context.Context, mode string, tables, run int) (res result) {
	res = newResult(mode, tables)
	fail := func(what string, err error) result {
		res.failure = fmt.Sprintf("run %d: %s: %v", run+1, what, err)
		if res.verified == "n/a" && mode != modeNone {
			res.verified = "NO"
		}
		b.logf("%s/%d: FAILED: %s", mode, tables, res.failure)
		return res
	}
	src, err := pgtest.Launch(pgtest.Options{Logical: true, Fsync: true, Settings: serverSettings})
	if err != nil {
		return fail("launch the source", err)
	}
	defer src.Close()
	var dst *pgtest.Server
	if mode != modeNone {
		if dst, err = pgtest.Launch(pgtest.Options{Fsync: true, Settings: serverSettings}); err != nil {
			return fail("launch the target", err)
		}
		defer dst.Close()
	}
	if b.version == "" {
		var v int
		if queryInt(ctx, src.DSN, "SELECT current_setting('server_version_num')::int", &v) == nil {
			b.version = fmt.Sprintf("%d.%d", v/10000, v%10000)
		}
	}
	if err := createSchema(ctx, src.DSN, tables); err != nil {
		return fail("create the tables", err)
	}
	var f feed
	var cf *cdcflowFeed
	switch mode {
	case modeNative:
		f = &nativeFeed{src: src, dst: dst, tables: tables}
	case modeCDCFlow, modeBaseline:
		bin := b.bin
		if mode == modeBaseline {
			bin = b.opts.baseline
		}
		cf = &cdcflowFeed{bin: bin, src: src.DSN, dst: dst.DSN, logDir: b.logDir(), tables: tables, profile: b.opts.profileDir != "", extraArgs: b.opts.serveArgs}
		f = cf
	}
	probeConn, err := connectLean(ctx, src.DSN)
	if err != nil {
		return fail("connect the prober", err)
	}
	defer probeConn.Close(context.Background())
	pr := &prober{conn: probeConn}
	ld, err := newLoader(ctx, src.DSN, tables, b.opts.clients, b.opts.seed+uint64(run))
	if err != nil {
		return fail("connect the load clients", err)
	}
	defer ld.close()
	check := func() error { return nil }
	if f != nil {
		check = f.check
		defer func() {
			if err := f.close(); err != nil && res.failure == "" {
				res = fail("stop the changefeed", err)
			}
		}()
		t0 := time.Now()
		if err := f.start(ctx); err != nil {
			return fail("start the changefeed", err)
		}
		id, err := pr.write(ctx)
		if err != nil {
			return fail("write a probe", err)
		}
		if _, err := waitFence(ctx, dst.DSN, 0, 0, id, b.opts.timeout, check); err != nil {
			return fail("wait for the changefeed to stream", err)
		}
		b.logf("%s/%d: streaming after %.1fs", mode, tables, time.Since(t0).Seconds())
	}

	// The main load, flat out, with a probe every 100 ms and the lag
	// sampled at the target every 100 ms.
	stopProbe := pr.every(ctx, 100*time.Millisecond)
	var stopSampler func() ([]float64, error)
	if dst != nil {
		stopSampler = sampleLag(ctx, dst.DSN, 100*time.Millisecond, time.Now())
	}
	var profDone chan error
	if cf != nil && b.opts.profileDir != "" {
		profDone = make(chan error, 1)
		go func() {
			time.Sleep(5 * time.Second)
			profDone <- cf.cpuProfile(ctx, 20*time.Second, filepath.Join(b.opts.profileDir, fmt.Sprintf("%s-%d-tables-run%d.pprof", mode, tables, run+1)))
		}()
	}
	meter := cpuMeter{}
	if meter.src, err = src.PostmasterPID(); err != nil {
		return fail("the source's postmaster", err)
	}
	if dst != nil {
		if meter.dst, err = dst.PostmasterPID(); err != nil {
			return fail("the target's postmaster", err)
		}
	}
	if cf != nil {
		meter.feed = cf.cpuTime
	}
	cpuBefore, err := meter.read()
	if err != nil {
		return fail("read CPU times", err)
	}
	stopSeries := meter.series(10*time.Second, func() int64 { return ld.committed.Load() * rowsPerTxn }, func(format string, args ...any) {
		b.logf("%s/%d:"+format, append([]any{mode, tables}, args...)...)
	})
	st, loadErr := ld.run(ctx, b.opts.rows)
	windows := stopSeries()
	if cpuAfter, err := meter.read(); err == nil {
		res.cpuLoad = perRow(cpuBefore, cpuAfter, meter.present(), st.rows)
	} else {
		b.logf("%s/%d: no CPU figures for the main load: %v", mode, tables, err)
	}
	probeErr := stopProbe()
	if stopSampler != nil {
		lags, err := stopSampler()
		if err != nil {
			return fail("sample the lag", err)
		}
		res.lagP50, res.lagP99, res.lagMax = percentile(lags, 50), percentile(lags, 99), percentile(lags, 100)
		b.logf("%s/%d: lag max per 100 samples, about 10 s (ms): %s", mode, tables, windowMax(lags, 100))
	}
	if err := errors.Join(loadErr, probeErr); err != nil {
		return fail("the main load", err)
	}
	res.rowsPerSec, res.windowRate = st.rowsPerSec(), median(windows)
	b.logf("%s/%d: %d rows in %.1fs: %.0f rows/s; lag p50 %s p99 %s max %s ms", mode, tables, st.rows, st.elapsed.Seconds(),
		res.rowsPerSec, num(res.lagP50, 0), num(res.lagP99, 0), num(res.lagMax, 0))
	if profDone != nil {
		if err := <-profDone; err != nil {
			b.logf("%s/%d: no CPU profile: %v", mode, tables, err)
		}
	}
	if f == nil {
		return res
	}

	// Catch-up: from the fence's commit until the target holds it.
	probeID, committed, err := pr.fence(ctx, ld, fenceMain)
	if err != nil {
		return fail("write the fence", err)
	}
	caught, err := waitFence(ctx, dst.DSN, tables, fenceMain, probeID, b.opts.timeout, check)
	if err != nil {
		return fail("catch up after the load", err)
	}
	res.catchUp = seconds(caught.Sub(committed))
	b.logf("%s/%d: caught up %.1fs after the load", mode, tables, res.catchUp)

	// The backlog: the changefeed stopped, rows loaded, then its drain.
	if b.opts.backlog > 0 {
		b.settleSlot(ctx, src.DSN, f.publication(), mode, tables)
		if err := f.pause(ctx); err != nil {
			return fail("stop the changefeed", err)
		}
		// A probe before the backlog: the restart's start-up lasts until
		// the target holds it.
		firstID, err := pr.write(ctx)
		if err != nil {
			return fail("write the backlog's first probe", err)
		}
		bst, err := ld.run(ctx, b.opts.backlog)
		if err != nil {
			return fail("the backlog load", err)
		}
		probeID, _, err := pr.fence(ctx, ld, fenceBacklog)
		if err != nil {
			return fail("write the backlog's fence", err)
		}
		// The load clients' backends hold a plan per statement and table;
		// idle through the drain, they would only take CPU from it (see
		// connectLean). Nothing loads after the backlog.
		ld.close()
		b.logSlotWAL(ctx, src.DSN, f.publication(), mode, tables)
		cpuBefore, cpuErr := meter.read()
		srcBefore := meter.sourceParts()
		t0 := time.Now()
		if err := f.resume(ctx); err != nil {
			return fail("restart the changefeed", err)
		}
		first, err := waitFence(ctx, dst.DSN, 0, 0, firstID, b.opts.timeout, check)
		if err != nil {
			return fail("restart the changefeed", err)
		}
		res.startUp = seconds(first.Sub(t0))
		var drainProf chan error
		if cf != nil && b.opts.profileDir != "" {
			// Shorter than the drain at 1000 tables (about 10 s); a profile
			// cut short by the drain's end still holds what it sampled.
			drainProf = make(chan error, 1)
			go func() {
				drainProf <- cf.cpuProfile(ctx, 5*time.Second, filepath.Join(b.opts.profileDir, fmt.Sprintf("%s-%d-tables-run%d-drain.pprof", mode, tables, run+1)))
			}()
		}
		drained, err := waitFence(ctx, dst.DSN, tables, fenceBacklog, probeID, b.opts.timeout, check)
		if cpuErr == nil && err == nil {
			var cpuAfter cpuParts
			if cpuAfter, cpuErr = meter.read(); cpuErr == nil {
				res.cpuDrain = perRow(cpuBefore, cpuAfter, meter.present(), bst.rows)
			}
		}
		if cpuErr != nil {
			b.logf("%s/%d: no CPU figures for the drain: %v", mode, tables, cpuErr)
		}
		if drainProf != nil {
			if err := <-drainProf; err != nil {
				b.logf("%s/%d: no drain CPU profile: %v", mode, tables, err)
			}
		}
		if err != nil {
			return fail("drain the backlog", err)
		}
		res.drain = seconds(drained.Sub(t0))
		res.drainRate = float64(bst.rows) / res.drain
		b.logf("%s/%d: backlog of %d rows (loaded at %.0f rows/s) drained in %.1fs (start-up %.1fs): %.0f rows/s; source CPU µs/row: %s", mode, tables, bst.rows,
			bst.rowsPerSec(), res.drain, res.startUp, res.drainRate, splitPerRow(srcBefore, meter.sourceParts(), bst.rows))
	}

	// Verification: cdcserver compare over the changefeed's publication.
	out, err := b.compare(ctx, src.DSN, dst.DSN, f.publication())
	switch {
	case err == nil:
		res.verified = "yes"
	case errors.Is(err, errDiffer):
		res.verified = "NO"
		res.failure = fmt.Sprintf("run %d: compare: %s", run+1, lastLine(out))
	default:
		return fail("compare", err)
	}
	if cf != nil {
		if err := cf.pause(ctx); err != nil {
			return fail("stop cdcserver serve", err)
		}
		b.logf("%s/%d: cdcserver serve used %.1fs of CPU over %d starts, peak RSS %d MiB", mode, tables, cf.cpu.Seconds(), cf.starts, cf.maxRSS>>20)
	}
	b.logf("%s/%d: verified %s", mode, tables, res.verified)
	return res
}

var errDiffer = errors.New("compare: tables differ")

// compare runs `cdcserver compare`: nil when equal, errDiffer when a
// table differs (exit 1), another error otherwise.
func (b *bench) compare(ctx context.Context, src, dst, pub string) (string, error) {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, b.bin, "compare", "--source", src, "--sink", dst, "--publication", pub)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out.String(), nil
	case errors.As(err, &ee) && ee.ExitCode() == 1:
		return out.String(), errDiffer
	default:
		return out.String(), fmt.Errorf("%w: %s", err, lastLine(out.String()))
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// sampleLag polls the target's newest probe every period until the
// returned stop is called: each sample is now minus that probe's
// clock_timestamp() at the source (same machine, same clock), in ms, or
// minus since (the load's start) while the newest is older: the source
// was idle before, so a target holding the probe that showed it
// streaming held everything up to since.
func sampleLag(ctx context.Context, dsn string, period time.Duration, since time.Time) (stop func() ([]float64, error)) {
	ctx, cancel := context.WithCancel(ctx)
	type out struct {
		lags []float64
		err  error
	}
	done := make(chan out, 1)
	go func() {
		conn, err := connect(ctx, dsn)
		if err != nil {
			done <- out{err: err}
			return
		}
		defer conn.Close(context.Background())
		var lags []float64
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				done <- out{lags: lags}
				return
			case <-tick.C:
			}
			var ts time.Time
			err := conn.QueryRow(ctx, "SELECT ts FROM "+probeTable+" ORDER BY id DESC LIMIT 1").Scan(&ts)
			switch {
			case errors.Is(err, pgx.ErrNoRows):
			case err != nil && ctx.Err() != nil:
			case err != nil:
				done <- out{err: err}
				return
			default:
				lags = append(lags, float64(time.Since(later(ts, since)).Microseconds())/1000)
			}
		}
	}()
	return func() ([]float64, error) {
		cancel()
		o := <-done
		return o.lags, o.err
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// windowMax is the largest of each run of n samples, as a short line.
func windowMax(xs []float64, n int) string {
	var parts []string
	for i := 0; i < len(xs); i += n {
		w := xs[i:min(i+n, len(xs))]
		parts = append(parts, fmt.Sprintf("%.0f", percentile(w, 100)))
	}
	return strings.Join(parts, " ")
}

// logDir is where serve's logs go: -logs, or the run's temporary
// directory.
func (b *bench) logDir() string {
	if b.opts.logs != "" {
		return b.opts.logs
	}
	return b.tmp
}

// settleSlot moves the slot's restart point past the main load before the
// changefeed stops, in every mode: it asks the source for a checkpoint,
// which logs a running-xacts record, and waits until the consumer's
// confirmation has moved restart_lsn past the WAL's position before it.
// Left alone, the restart point moves only at the running-xacts records
// the source logs every 15 s while it writes, once each is decoded and
// confirmed, so where the stop found it was chance: 0.1 to 46 MB of WAL
// that the restart's walsender decoded again before the backlog, for
// either mode, which moved a drain by more than the modes differ (the
// walsender, on the cores both share, spent 9 to 10 µs a drained row with
// nothing to decode again and 13 to 17 with 27 to 31 MB). A candidate
// restart point taken before the checkpoint must be confirmed first, so it
// may take a second checkpoint; after a minute it gives up and says so
// (logSlotWAL then shows what the restart decodes again).
func (b *bench) settleSlot(ctx context.Context, dsn, slot, mode string, tables int) {
	t0 := time.Now()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.logf("%s/%d: settle the slot: %v", mode, tables, err)
		return
	}
	defer conn.Close(context.Background())
	var from string
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&from); err != nil {
		b.logf("%s/%d: settle the slot: %v", mode, tables, err)
		return
	}
	const q = "SELECT restart_lsn >= $1::pg_lsn FROM pg_replication_slots WHERE slot_name = $2"
	for checkpoints := 1; time.Since(t0) < time.Minute; checkpoints++ {
		if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
			b.logf("%s/%d: settle the slot: %v", mode, tables, err)
			return
		}
		for wait := time.Now().Add(5 * time.Second); time.Now().Before(wait); {
			var passed bool
			if err := conn.QueryRow(ctx, q, from, slot).Scan(&passed); err != nil {
				b.logf("%s/%d: settle the slot: %v", mode, tables, err)
				return
			}
			if passed {
				b.logf("%s/%d: the slot's restart point passed the main load %.1fs after %d checkpoint(s)", mode, tables, time.Since(t0).Seconds(), checkpoints)
				return
			}
			time.Sleep(100 * time.Millisecond) // polling the source's slot with a deadline
		}
	}
	b.logf("%s/%d: the slot's restart point did not pass the main load within a minute", mode, tables)
}

// logSlotWAL logs how much WAL the restart's walsender decodes: from the
// slot's restart_lsn to its confirmed position (decoded again, sent to no
// one: the slot's restart point moves only at a running-xacts record both
// decoded and confirmed) and from there to now (the backlog). The first
// part differs from run to run and mode to mode, and the drain's CPU with it.
func (b *bench) logSlotWAL(ctx context.Context, dsn, slot, mode string, tables int) {
	var again, backlog int
	q := "SELECT pg_wal_lsn_diff(confirmed_flush_lsn, restart_lsn)::bigint FROM pg_replication_slots WHERE slot_name = '" + slot + "'"
	if err := queryInt(ctx, dsn, q, &again); err != nil {
		b.logf("%s/%d: the slot's position: %v", mode, tables, err)
		return
	}
	q = "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint FROM pg_replication_slots WHERE slot_name = '" + slot + "'"
	if err := queryInt(ctx, dsn, q, &backlog); err != nil {
		b.logf("%s/%d: the slot's position: %v", mode, tables, err)
		return
	}
	b.logf("%s/%d: the restart decodes %.1f MB of WAL again before the slot's confirmed position, then %.1f MB of backlog",
		mode, tables, float64(again)/1e6, float64(backlog)/1e6)
}

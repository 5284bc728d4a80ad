package replicate

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/pgtest"
	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/pgsink"
	"github.com/cdcflow/eventservice/pkg/pgsource"
)

// targetQueryRow scans one row of sql on the target into dest.
func (p *pair) targetQueryRow(sql string, dest ...any) error {
	conn, err := pgx.Connect(context.Background(), p.dst.DSN)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(context.Background(), sql).Scan(dest...)
}

// oid is a source table's OID.
func (p *pair) oid(table string) uint32 {
	p.t.Helper()
	var oid uint32
	require.NoError(p.t, p.conn.QueryRow(context.Background(), "SELECT $1::regclass::oid", table).Scan(&oid))
	return oid
}

// status reads the pair's changefeed status.
func (p *pair) status() *Status {
	p.t.Helper()
	st, err := ReadStatus(context.Background(), p.src.DSN, p.dst.DSN, "cdcflow", "cdcflow")
	require.NoError(p.t, err)
	return st
}

// lsn reads an LSN-valued expression on the source.
func (p *pair) lsn(sql string) pglogrepl.LSN {
	p.t.Helper()
	var s *string
	require.NoError(p.t, p.conn.QueryRow(context.Background(), sql).Scan(&s))
	if s == nil {
		return 0
	}
	l, err := pglogrepl.ParseLSN(*s)
	require.NoError(p.t, err)
	return l
}

// metricsAddr waits until serve names where it serves /metrics on
// stderr (polling with a deadline).
func metricsAddr(t *testing.T, stderr *syncBuffer) string {
	t.Helper()
	re := regexp.MustCompile(`serve: replicating \d+ tables; metrics at (\S+)`)
	var addr string
	testwait.Within(t, 2*time.Minute, "serve's metrics address", func() bool {
		if m := re.FindStringSubmatch(stderr.String()); m != nil {
			addr = m[1]
		}
		return addr != ""
	})
	require.NotEqual(t, "(none)", addr, "serve serves /metrics")
	return addr
}

// status and remove of a changefeed whose serve is not running: status
// shows the binding, the inactive slot and the WAL it retains, the
// snapshot, each table's checkpoint, and the stopped table with why (exit
// 1: something to act on); remove is refused while a serve streams the
// slot, then drops the slot and the registration and the target's
// cdcflow state, keeps the target's tables and rows, and can run again.
func TestStatusAndRemoveOfAStoppedChangefeed(t *testing.T) {
	p := newPair(t)
	p.exec("CREATE TABLE t1 (id int PRIMARY KEY, v text)")
	p.exec("CREATE TABLE t2 (id int PRIMARY KEY, v text, w text)")
	p.exec("INSERT INTO t1 SELECT g, 'v' FROM generate_series(1, 50) g")
	p.exec("INSERT INTO t2 SELECT g, 'v', 'w' FROM generate_series(1, 50) g")
	stop, stderr := p.serve(p.config())
	p.waitEqual("the snapshot")
	// A conversion the target cannot know (USING): t2 stops.
	p.exec("ALTER TABLE t2 ALTER COLUMN w TYPE int USING length(w)")
	p.exec("INSERT INTO t2 VALUES (51, 'after')")
	testwait.Within(t, time.Minute, "t2 stopped and recorded", func() bool { return p.status().Counts["stopped"] == 1 })

	err := Remove(context.Background(), RemoveOptions{Source: p.src.DSN, Sink: p.dst.DSN, Slot: "cdcflow", Publication: "cdcflow"}, io.Discard)
	require.ErrorIs(t, err, ErrSlotActive, "refused while serve streams the slot")
	require.NoError(t, stop(), stderr.String())
	// The stop does not wait out its timeout for a quiesce the stopped
	// table can never let finish (it did, then warned).
	require.Contains(t, stderr.String(), "stopping at the slot's position: stopped tables hold it")
	require.NotContains(t, stderr.String(), "stopping without confirming the last commit")

	st := p.status()
	var out bytes.Buffer
	st.WriteText(&out)
	text := out.String()
	require.True(t, st.Registered && st.BoundHere, text)
	require.True(t, st.CreatedPublication, text)
	require.True(t, st.SlotStats.Exists, text)
	require.False(t, st.SlotStats.Active, text)
	require.Positive(t, st.SlotStats.RetainedBytes, text)
	require.Equal(t, "reserved", st.SlotStats.WALStatus, text)
	require.Equal(t, "applied", st.Snapshot, text)
	require.Len(t, st.Tables, 2, text)
	require.Equal(t, "replicating", st.Tables[0].State, text)
	require.False(t, st.Tables[0].Checkpoint.IsZero(), text)
	require.Equal(t, "stopped", st.Tables[1].State, text)
	require.Contains(t, st.Tables[1].Reason, "USING length(w)", text)
	require.ErrorIs(t, st.StatusExit(), errStatusProblem)
	require.Contains(t, text, "inactive")
	require.Contains(t, text, "stopped: ")
	b, err := json.Marshal(st)
	require.NoError(t, err)
	require.Contains(t, string(b), `"retained_bytes"`)

	out.Reset()
	require.NoError(t, Remove(context.Background(), RemoveOptions{Source: p.src.DSN, Sink: p.dst.DSN, Slot: "cdcflow", Publication: "cdcflow"}, &out))
	require.Contains(t, out.String(), "dropped slot cdcflow")
	require.Contains(t, out.String(), "dropped publication cdcflow")
	st = p.status()
	require.False(t, st.Registered)
	require.False(t, st.SlotStats.Exists)
	var rows int
	require.NoError(t, p.conn.QueryRow(context.Background(), "SELECT count(*) FROM pg_publication WHERE pubname = 'cdcflow'").Scan(&rows))
	require.Zero(t, rows, "the publication the changefeed made is gone")
	require.Equal(t, 50, p.targetCount("public.t1", "true"), "the target's rows stay")
	dst, err := pgx.Connect(context.Background(), p.dst.DSN)
	require.NoError(t, err)
	defer dst.Close(context.Background())
	var schema bool
	require.NoError(t, dst.QueryRow(context.Background(), "SELECT to_regnamespace('cdcflow') IS NOT NULL").Scan(&schema))
	require.False(t, schema, "the target's cdcflow state is gone")
	require.NoError(t, p.conn.QueryRow(context.Background(), "SELECT to_regnamespace('cdcflow') IS NOT NULL").Scan(&schema))
	require.False(t, schema, "the source's registry is gone with its last changefeed")
	require.NoError(t, Remove(context.Background(), RemoveOptions{Source: p.src.DSN, Sink: p.dst.DSN, Slot: "cdcflow", Publication: "cdcflow"}, io.Discard),
		"a second remove finds nothing left and succeeds")
}

// A table stopped by a change the target cannot apply holds the slot (its
// checkpoint never moves), and so the whole source's WAL: past
// --max-retained-wal it lets go. The release is logged at ERROR, counted,
// recorded (status says released, a fresh copy is owed), and the slot's
// confirmed and restart positions then pass WAL written after the stop.
func TestAStoppedTablePastMaxRetainedWALIsReleased(t *testing.T) {
	p := newPair(t)
	p.exec("CREATE TABLE t1 (id int PRIMARY KEY, v text)")
	p.exec("CREATE TABLE t2 (id int PRIMARY KEY, v text, w text)")
	p.exec("INSERT INTO t2 SELECT g, 'v', 'w' FROM generate_series(1, 50) g")
	cfg := p.config()
	cfg.LogLevel = "info"
	cfg.MaxRetainedWAL = 1 // any WAL at all: released as soon as it is seen stopped
	cfg.slotStatsInterval = 100 * time.Millisecond
	stop, stderr := p.serve(cfg)
	defer func() { _ = stop() }()
	p.waitEqual("the snapshot")
	p.exec("ALTER TABLE t2 ALTER COLUMN w TYPE int USING length(w)") // a conversion the target cannot know: t2 stops
	p.exec("INSERT INTO t2 VALUES (51, 'after')")
	testwait.Within(t, time.Minute, "t2 released", func() bool { return p.status().Counts["released"] == 1 })
	require.Contains(t, stderr.String(), "released")
	st := p.status()
	require.Equal(t, "released", st.Tables[1].State)
	var copies string
	require.NoError(t, p.targetQueryRow("SELECT value FROM cdcflow.state WHERE key = 'copies:cdcflow'", &copies))
	require.Contains(t, copies, fmt.Sprintf("%d!", p.oid("t2")), "a fresh copy is owed")

	// WAL written after the stop: the slot passes it.
	p.exec("INSERT INTO t1 SELECT g, 'v' FROM generate_series(1, 10) g")
	after := p.lsn("SELECT pg_current_wal_lsn()::text")
	testwait.Within(t, 2*time.Minute, "the slot past the WAL written after the stop", func() bool {
		p.exec("CHECKPOINT") // a running-xacts record: where the restart point can move to
		p.exec("INSERT INTO t1 VALUES (1000 + (random() * 1e6)::int, 'tick') ON CONFLICT DO NOTHING")
		return p.lsn("SELECT restart_lsn::text FROM pg_replication_slots WHERE slot_name = 'cdcflow'") > after
	})
	require.GreaterOrEqual(t, p.lsn("SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'cdcflow'"), after)
}

// toRelease lets go of nothing within the bound, without one, or before
// the slot was read; past it, every stopped table not let go of yet.
func TestToReleasePicksStoppedTablesPastTheBound(t *testing.T) {
	stopped := []pgsink.StoppedTable{{OID: 1}, {OID: 2, Released: true}, {OID: 3}}
	st := pgsource.SlotStats{Exists: true, RetainedBytes: 100}
	require.Empty(t, toRelease(st, 0, stopped), "no bound")
	require.Empty(t, toRelease(st, 100, stopped), "at the bound")
	require.Empty(t, toRelease(pgsource.SlotStats{RetainedBytes: 100}, 10, stopped), "the slot not read")
	got := toRelease(st, 99, stopped)
	require.Len(t, got, 2)
	require.Equal(t, uint32(1), got[0].OID)
	require.Equal(t, uint32(3), got[1].OID)
	require.Empty(t, toRelease(st, 99, nil), "nothing stopped")
}

// /readyz is never ready while the target lacks rows of the initial
// snapshot: the target is a cut-over point only once it is applied. Polled
// from the start, every 200 finds every row there, and it does become
// ready.
func TestReadyzIsNeverReadyBeforeTheSnapshotIsApplied(t *testing.T) {
	p := newPair(t)
	const n = 20000
	p.exec("CREATE TABLE t (id int PRIMARY KEY, v text)")
	p.exec(fmt.Sprintf("INSERT INTO t SELECT g, 'v' || g FROM generate_series(1, %d) g", n))
	cfg := p.config()
	cfg.SinkWorkers = 1
	cfg.SinkFlushInterval, cfg.SinkMaxFlushInterval = time.Second, time.Second // a slow apply: a wide window
	stop, stderr := p.serve(cfg)
	defer func() { _ = stop() }()
	addr := metricsAddr(t, stderr)
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	var early atomic.Int64
	testwait.Within(t, 2*time.Minute, "ready", func() bool {
		resp, err := client.Get("http://" + addr + "/readyz")
		if err != nil {
			return false
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return false
		}
		if got := p.targetCount("public.t", "true"); got != n {
			early.Add(1)
			t.Errorf("/readyz said ready (%s) with %d of %d rows in the target", bytes.TrimSpace(body), got, n)
		}
		return true
	})
	require.Zero(t, early.Load())
}

// metricValue scrapes serve's /metrics at addr for one sample's value
// (false: not there).
func metricValue(t *testing.T, addr, sample string) (float64, bool) {
	t.Helper()
	tr := &http.Transport{DisableKeepAlives: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`).FindSubmatch(body)
	if m == nil {
		return 0, false
	}
	var v float64
	_, err = fmt.Sscan(string(m[1]), &v)
	return v, err == nil
}

// An idle changefeed's lag is 0 (nothing decoded waits to be applied; it
// read 1-2 s before, the age of an idle table's checkpoint). A target
// outage is the sink's: logged once when it begins and once when it ends,
// with its cause and without pgx's TLS fallback noise, and never under the
// source, whose stream goes on (TestAPositionThatCannotBeSavedDoesNotEndTheSession
// holds the save that ended it); then the target is equal again.
func TestATargetOutageIsTheSinksAndAnIdleLagIsZero(t *testing.T) {
	p := newPair(t)
	p.exec("CREATE TABLE t (id int PRIMARY KEY, v text)")
	p.exec("INSERT INTO t SELECT g, 'v' FROM generate_series(1, 100) g")
	cfg := p.config()
	cfg.LogLevel = "info"
	cfg.Sink += "&sslmode=prefer" // pgx tries TLS first: its refusal must not be the logged cause
	cfg.Sink = regexp.MustCompile(`sslmode=disable&?`).ReplaceAllString(cfg.Sink, "")
	stop, stderr := p.serve(cfg)
	defer func() { _ = stop() }()
	addr := metricsAddr(t, stderr)
	p.waitEqual("the snapshot")
	testwait.Within(t, time.Minute, "an idle lag of 0", func() bool {
		v, ok := metricValue(t, addr, "cdcflow_serve_lag_seconds")
		return ok && v == 0
	})

	require.NoError(t, p.dst.Stop())
	p.exec("UPDATE t SET v = 'during' WHERE id <= 10")
	testwait.Within(t, time.Minute, "the outage logged", func() bool {
		return regexp.MustCompile(`the target is (unreachable|shutting down|failing|terminated)`).MatchString(stderr.String()) ||
			regexp.MustCompile(`the target ended the session`).MatchString(stderr.String())
	})
	testwait.Within(t, time.Minute, "the sink disconnected", func() bool {
		v, ok := metricValue(t, addr, "cdcflow_pgsink_connected")
		return ok && v == 0
	})
	require.NoError(t, p.dst.Restart())
	testwait.Within(t, 2*time.Minute, "the target back", func() bool { return regexp.MustCompile(`the target is back`).MatchString(stderr.String()) })
	p.waitEqual("after the target's outage")
	log := stderr.String()
	require.Equal(t, 1, len(regexp.MustCompile(`retrying until it is back`).FindAllString(log, -1)), "one line when it began:\n%s", log)
	require.Equal(t, 1, len(regexp.MustCompile(`the target is back`).FindAllString(log, -1)), "one line when it ended:\n%s", log)
	require.NotContains(t, log, "tls error")
	require.NotRegexp(t, `the source (is unreachable|is shutting down|is failing|is starting up|ended the session)`, log,
		"the source's stream never noticed")
	v, ok := metricValue(t, addr, "cdcflow_pgsource_reconnects_total")
	require.True(t, ok)
	require.Zero(t, v, "the stream never reconnected")
}

// A slot the server invalidated (wal_status lost: more WAL than
// max_slot_wal_keep_size while serve was down) is reported as exactly that
// at start, with what starts over, and by status; never as a protocol
// violation. Dropping the slot, as it says, starts over and the target is
// equal again.
func TestALostSlotIsReportedAsLost(t *testing.T) {
	p := newPair(t)
	p.exec("CREATE TABLE t (id int PRIMARY KEY, v text)")
	p.exec("INSERT INTO t SELECT g, 'v' FROM generate_series(1, 100) g")
	stop, stderr := p.serve(p.config())
	p.waitEqual("the snapshot")
	require.NoError(t, stop(), stderr.String())

	pgtestSet(t, p, "max_slot_wal_keep_size", "1MB")
	testwait.Within(t, time.Minute, "the slot lost", func() bool {
		p.exec("INSERT INTO t VALUES (1000 + (random() * 1e6)::int, 'wal') ON CONFLICT DO NOTHING")
		p.exec("SELECT pg_switch_wal()")
		p.exec("CHECKPOINT")
		var status string
		require.NoError(t, p.conn.QueryRow(context.Background(), "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'cdcflow'").Scan(&status))
		return status == "lost"
	})
	err := p.runOnce(p.config())
	require.ErrorIs(t, err, ErrSetup)
	require.ErrorIs(t, err, pgsource.ErrSlotLost)
	require.ErrorContains(t, err, "pg_drop_replication_slot('cdcflow')")
	st := p.status()
	require.Equal(t, "lost", st.SlotStats.WALStatus)
	require.ErrorIs(t, st.StatusExit(), errStatusProblem)

	pgtestSet(t, p, "max_slot_wal_keep_size", "-1")
	p.exec("SELECT pg_drop_replication_slot('cdcflow')")
	p.exec("DELETE FROM t WHERE id <= 10") // while no slot was there to see it
	stop, stderr = p.serve(p.config())
	p.waitEqual("the start over")
	require.NoError(t, stop(), stderr.String())
}

// pgtestSet sets a source setting (ALTER SYSTEM and a reload).
func pgtestSet(t *testing.T, p *pair, name, value string) {
	t.Helper()
	pgtest.Set(t, p.conn, name, value)
}

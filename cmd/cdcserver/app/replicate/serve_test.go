package replicate

import (
	"bytes"
	"context"
	"fmt"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/cdcflow/eventservice/internal/pgtest"
	"github.com/cdcflow/eventservice/internal/testwait"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// syncBuffer is a goroutine-safe stderr for Run.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type pair struct {
	t        *testing.T
	src, dst *pgtest.Server
	conn     *pgx.Conn
}

func newPair(t *testing.T) *pair {
	return newPairWith(t, pgtest.Options{}, pgtest.Options{})
}

// newPairWith is newPair with the servers' options (the source's is
// always logical).
func newPairWith(t *testing.T, src, dst pgtest.Options) *pair {
	src.Logical = true
	p := &pair{t: t, src: pgtest.StartWith(t, src), dst: pgtest.StartWith(t, dst)}
	conn, err := pgx.Connect(context.Background(), p.src.DSN)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	p.conn = conn
	return p
}

func (p *pair) exec(sql string, args ...any) {
	p.t.Helper()
	_, err := p.conn.Exec(context.Background(), sql, args...)
	require.NoError(p.t, err, sql)
}

func (p *pair) config() Config {
	cfg := DefaultConfig()
	cfg.Source, cfg.Sink = p.src.DSN, p.dst.DSN
	cfg.MetricsAddr, cfg.PprofAddr, cfg.LogLevel, cfg.ProgressInterval = "127.0.0.1:0", "", "warn", 0
	cfg.DataDir = p.t.TempDir()
	return cfg
}

// runOnce runs serve as a start that is expected to end by itself (a
// setup error, exit 2), with a deadline.
func (p *pair) runOnce(cfg Config) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	return Run(ctx, cfg, &syncBuffer{})
}

// serve runs serve until the returned stop is called (again: the same
// result, so a test may defer it and call it too).
func (p *pair) serve(cfg Config) (stop func() error, stderr *syncBuffer) {
	ctx, cancel := context.WithCancel(context.Background())
	stderr = &syncBuffer{}
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, stderr) }()
	var once sync.Once
	var err error
	return func() error {
		once.Do(func() {
			cancel()
			err = <-done
		})
		return err
	}, stderr
}

// waitEqual waits until compare finds the tables equal.
func (p *pair) waitEqual(what string) {
	p.t.Helper()
	var out bytes.Buffer
	var err error
	if !testwait.Until(2*time.Minute, func() bool {
		out.Reset()
		err = Compare(context.Background(), p.src.DSN, p.dst.DSN, "cdcflow", &out)
		return err == nil
	}) {
		p.t.Fatalf("%s: never equal: %v\n%s", what, err, out.String())
	}
}

// A source with rows is copied (the snapshot), then inserts, updates
// (some leaving a TOASTed column unchanged, some of those changing the
// key), deletes, a truncate, a new column and a new table stream in; a
// clean stop and a restart resume from the target's checkpoints, writes
// made while it was down included; compare finds the tables equal at each
// step, and the slot's confirmed flush LSN has moved on.
func TestServeReplicatesAndResumes(t *testing.T) {
	p := newPair(t)
	for i := 1; i <= 5; i++ {
		p.exec(fmt.Sprintf("CREATE TABLE t%d (id int PRIMARY KEY, v text, body text)", i))
		p.exec(fmt.Sprintf("ALTER TABLE t%d ALTER COLUMN body SET STORAGE EXTERNAL", i))
		p.exec(fmt.Sprintf("INSERT INTO t%d SELECT g, 'v' || g, repeat(md5(g::text), 200) FROM generate_series(1, 100) g", i))
	}
	stop, stderr := p.serve(p.config())
	p.waitEqual("the snapshot")
	for i := 1; i <= 5; i++ {
		p.exec(fmt.Sprintf("INSERT INTO t%d SELECT g, 'w' || g, NULL FROM generate_series(101, 150) g", i))
		p.exec(fmt.Sprintf("UPDATE t%d SET v = 'updated' WHERE id %% 3 = 0", i)) // body TOASTed and unchanged
		p.exec(fmt.Sprintf("DELETE FROM t%d WHERE id %% 7 = 0", i))
		p.exec(fmt.Sprintf("UPDATE t%d SET id = id + 10000 WHERE id %% 11 = 0", i)) // a new key, body TOASTed and unchanged
	}
	p.exec("TRUNCATE t5")
	p.exec("INSERT INTO t5 VALUES (1, 'after truncate', NULL)")
	p.waitEqual("the stream")
	p.exec("ALTER TABLE t1 ADD COLUMN extra numeric(10,2)")
	p.exec("UPDATE t1 SET extra = id * 1.5 WHERE id < 10")
	p.exec("CREATE TABLE t6 (a int, b text, PRIMARY KEY (a, b))")
	var lastWrite string
	require.NoError(t, p.conn.QueryRow(context.Background(), "SELECT pg_current_wal_lsn()::text").Scan(&lastWrite))
	p.exec("INSERT INTO t6 VALUES (1, 'x'), (2, 'y')")
	p.waitEqual("a new column and a new table")
	require.NoError(t, stop(), stderr.String())
	var confirmedAtStop bool
	require.NoError(t, p.conn.QueryRow(context.Background(), "SELECT confirmed_flush_lsn > $1::pg_lsn FROM pg_replication_slots", lastWrite).Scan(&confirmedAtStop))
	require.True(t, confirmedAtStop, "a clean stop confirms the last commit to the slot: the next start reads nothing again\n%s", stderr.String())

	var before string
	require.NoError(t, p.conn.QueryRow(context.Background(), "SELECT confirmed_flush_lsn::text FROM pg_replication_slots").Scan(&before))
	p.exec("INSERT INTO t2 SELECT g, 'while down', NULL FROM generate_series(1000, 1100) g")
	p.exec("UPDATE t6 SET b = 'z' WHERE a = 1")
	stop, stderr = p.serve(p.config())
	p.waitEqual("after the restart")
	p.exec("INSERT INTO t3 VALUES (5000, 'after restart', NULL)")
	p.waitEqual("new writes after the restart")
	testwait.Within(t, time.Minute, "the slot's confirmed flush LSN moving on", func() bool {
		var now string
		require.NoError(t, p.conn.QueryRow(context.Background(), "SELECT confirmed_flush_lsn::text FROM pg_replication_slots").Scan(&now))
		return now != before
	})
	require.NoError(t, stop(), stderr.String())
	require.NotContains(t, stderr.String(), "ERROR")
}

// What cannot be replicated is a typed error at start: a bad DSN, bad
// flags (the rest of what a start checks first:
// TestABadStartLeavesBothDatabasesAsTheyWere).
func TestServeRefusesAtStart(t *testing.T) {
	p := newPair(t)
	p.exec("CREATE TABLE t (a int PRIMARY KEY)")
	run := p.runOnce
	cfg := p.config()
	cfg.Source = "postgres://nobody@127.0.0.1:1/x?connect_timeout=2"
	gcBefore := debug.SetGCPercent(100)
	debug.SetGCPercent(gcBefore)
	require.ErrorIs(t, run(cfg), ErrSetup)
	gcAfter := debug.SetGCPercent(gcBefore)
	require.Equal(t, gcBefore, gcAfter, "the collector's target is restored when Run returns")
	cfg.GCPercent = 5
	require.ErrorIs(t, cfg.Validate(), ErrInvalidConfig)
	require.ErrorIs(t, Config{}.Validate(), ErrInvalidConfig)
	cfg = p.config()
	cfg.PprofAddr = "0.0.0.0:6060"
	require.ErrorIs(t, run(cfg), ErrInvalidConfig, "pprof stays on loopback")
	require.ErrorIs(t, Compare(context.Background(), p.src.DSN, p.dst.DSN, "nothing", &bytes.Buffer{}), ErrSetup,
		"an empty publication is not equal")
}

package pgsource

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"github.com/cdcflow/eventservice/internal/pgtest"
	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// memPositions is a PositionStore in memory (the edge under test is the
// source; TablePositions has its own test).
type memPositions struct {
	mu sync.Mutex
	m  map[uint64]Position
}

func newMemPositions() *memPositions { return &memPositions{m: map[uint64]Position{}} }

func (p *memPositions) Save(_ context.Context, _ string, pos Position) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.m[pos.LSN] = pos
	return nil
}

func (p *memPositions) Load(_ context.Context, _ string, lsn uint64) (Position, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pos, ok := p.m[lsn]
	return pos, ok, nil
}

// recordingSink is a subscription's sink that keeps what it is pushed and
// checks the upstream contract as the store would (the edge under test).
type recordingSink struct {
	t        *testing.T
	startTs  common.Ts
	mu       sync.Mutex
	rows     []common.Row
	resolved common.Ts
	batches  int
	changed  chan struct{}
}

func newRecordingSink(t *testing.T, startTs common.Ts) *recordingSink {
	return &recordingSink{t: t, startTs: startTs, resolved: startTs, changed: make(chan struct{}, 1)}
}

func (r *recordingSink) Push(_ context.Context, b eventstore.Batch) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, row := range b.Rows {
		if row.CommitTs <= r.resolved || row.CommitTs <= r.startTs {
			r.t.Errorf("row at %v at or below resolved %v / start %v", row.CommitTs, r.resolved, r.startTs)
		}
	}
	r.rows = append(r.rows, b.Rows...)
	if b.ResolvedTs != 0 {
		if b.ResolvedTs < r.resolved {
			r.t.Errorf("resolved regressed %v -> %v", r.resolved, b.ResolvedTs)
		}
		r.resolved = b.ResolvedTs
	}
	r.batches++
	select {
	case r.changed <- struct{}{}:
	default:
	}
	return nil
}

// changes decodes the rows received so far.
func (r *recordingSink) changes() []pgcodec.RowChange {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []pgcodec.RowChange
	for _, row := range r.rows {
		c, err := pgcodec.DecodeValue(row.Value)
		require.NoError(r.t, err)
		out = append(out, c)
	}
	return out
}

// waitFor waits until cond holds of the sink (polling on its pushes, with
// a deadline).
func (r *recordingSink) waitFor(what string, cond func() bool) {
	r.t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		r.mu.Lock()
		ok := cond()
		r.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-r.changed:
		case <-deadline:
			r.t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// srcEnv is a logical PostgreSQL and what a source needs.
type srcEnv struct {
	t      *testing.T
	pg     *pgtest.Server
	conn   *pgx.Conn
	schema *schemastore.Memory
	pos    *memPositions
}

func newSrcEnv(t *testing.T) *srcEnv {
	pg := pgtest.StartWith(t, pgtest.Options{Logical: true})
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pg.DSN)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	schema, err := schemastore.NewMemory(schemastore.MemoryOptions{InitialResolvedTs: 1})
	require.NoError(t, err)
	return &srcEnv{t: t, pg: pg, conn: conn, schema: schema, pos: newMemPositions()}
}

func (e *srcEnv) exec(sql string, args ...any) {
	e.t.Helper()
	_, err := e.conn.Exec(context.Background(), sql, args...)
	require.NoError(e.t, err, sql)
}

func (e *srcEnv) oid(table string) uint32 {
	e.t.Helper()
	var oid uint32
	require.NoError(e.t, e.conn.QueryRow(context.Background(), "SELECT $1::regclass::oid", table).Scan(&oid))
	return oid
}

// testOptions is what a test sets of a source: its options and its
// knobs (set on the Source before it opens).
type testOptions struct {
	Options
	knobs testingKnobs
}

func (e *srcEnv) source(tweak func(*testOptions)) *Source {
	e.t.Helper()
	opts := testOptions{Options: Options{DSN: e.pg.DSN, Schema: e.schema, Positions: e.pos, HeartbeatInterval: 100 * time.Millisecond,
		Logger: zaptest.NewLogger(e.t), StatusInterval: 100 * time.Millisecond, ResolvedInterval: 10 * time.Millisecond}}
	if tweak != nil {
		tweak(&opts)
	}
	s, err := New(opts.Options)
	require.NoError(e.t, err)
	s.knobs = opts.knobs
	e.t.Cleanup(s.Close)
	return s
}

func text(c pgcodec.RowChange, name string) string {
	for _, d := range c.Columns {
		if d.Name == name {
			switch d.Kind {
			case pgcodec.Null:
				return "<null>"
			case pgcodec.Unchanged:
				return "<unchanged>"
			}
			return string(d.Text)
		}
	}
	return "<absent>"
}

// A new slot: the rows that exist are copied at the snapshot's commit-ts,
// then inserts, updates (one changing the key: a delete and an insert),
// deletes and a truncate stream in commit order, each commit's rows in
// their WAL order, with commit-ts increasing and the resolved-ts passing
// them.
func TestSnapshotThenStream(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t1 (id int PRIMARY KEY, v text)")
	e.exec("INSERT INTO t1 SELECT g, 'v' || g FROM generate_series(1, 5) g")
	src := e.source(nil)
	info, err := src.Open(context.Background())
	require.NoError(t, err)
	require.True(t, info.Created)
	require.Len(t, info.Tables, 1)
	require.Equal(t, []string{"id"}, info.Tables[0].KeyColumns())
	sink := newRecordingSink(t, info.SnapshotTs-1)
	sub, err := src.Subscribe(common.TableSpan(int64(e.oid("t1"))), info.SnapshotTs-1, sink)
	require.NoError(t, err)
	defer sub.Close()
	require.NoError(t, src.Start())
	sink.waitFor("the snapshot", func() bool { return len(sink.rows) == 5 && sink.resolved >= info.SnapshotTs })
	for _, r := range sink.rows {
		require.Equal(t, info.SnapshotTs, r.CommitTs)
	}

	e.exec("INSERT INTO t1 VALUES (6, 'six')")
	e.exec("UPDATE t1 SET v = 'uno' WHERE id = 1")
	e.exec("BEGIN; UPDATE t1 SET id = 20 WHERE id = 2; DELETE FROM t1 WHERE id = 3; COMMIT")
	e.exec("TRUNCATE t1")
	e.exec("INSERT INTO t1 VALUES (7, NULL)")
	sink.waitFor("the stream", func() bool { return len(sink.rows) == 12 })
	got := sink.changes()[5:]
	var kinds []string
	for _, c := range got {
		kinds = append(kinds, c.Change.String()+":"+text(c, "id"))
	}
	require.Equal(t, []string{"insert:6", "update:1", "delete:2", "insert:20", "delete:3", "truncate:<absent>", "insert:7"}, kinds)
	require.Equal(t, "uno", text(got[1], "v"))
	require.Equal(t, "<null>", text(got[6], "v"))
	rows := sink.rows[5:]
	for i := 1; i < len(rows); i++ {
		require.LessOrEqual(t, rows[i-1].CommitTs, rows[i].CommitTs, "commit order")
	}
	require.Equal(t, rows[2].CommitTs, rows[4].CommitTs, "one transaction, one commit-ts")
	last := rows[len(rows)-1].CommitTs
	sink.waitFor("resolved past the last commit", func() bool { return sink.resolved >= last })
	require.Less(t, time.Since(last.Physical()), time.Minute, "commit-ts is near the wall clock")
}

// An idle database still advances: heartbeats make commits, the
// resolved-ts follows them and the slot's position moves with the safe
// point.
func TestIdleDatabaseAdvances(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t1 (id int PRIMARY KEY)")
	var safe common.Ts
	var mu sync.Mutex
	src := e.source(func(o *testOptions) {
		o.SafePoint = func() (common.Ts, bool) {
			mu.Lock()
			defer mu.Unlock()
			return safe, safe != 0
		}
	})
	info, err := src.Open(context.Background())
	require.NoError(t, err)
	sink := newRecordingSink(t, info.SnapshotTs-1)
	sub, err := src.Subscribe(common.TableSpan(int64(e.oid("t1"))), info.SnapshotTs-1, sink)
	require.NoError(t, err)
	defer sub.Close()
	require.NoError(t, src.Start())
	sink.waitFor("resolved beyond the snapshot without a write", func() bool { return sink.resolved > info.SnapshotTs })
	first := src.Position()
	mu.Lock()
	safe = sink.resolved
	mu.Unlock()
	testwait.Within(t, 60*time.Second, "the slot moves to the safe point", func() bool { return src.Position().LSN > first.LSN })
	testwait.Within(t, 60*time.Second, "the server's confirmed flush LSN follows", func() bool {
		lsn, ok, err := slotLSN(context.Background(), e.conn, "cdcflow")
		require.NoError(t, err)
		return ok && lsn > first.LSN
	})
}

// Errors at Open name what is wrong; a table without a key is taken, its
// identity saying how its rows are found (inserts only, here).
func TestOpenRefusesWhatCannotBeReplicated(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE keyless (a int, b text)")
	e.exec("CREATE TABLE keyed (a int PRIMARY KEY)")
	info, err := e.source(nil).Open(context.Background())
	require.NoError(t, err)
	require.Len(t, info.Tables, 2)
	require.Equal(t, "keyed", info.Tables[0].Name)
	require.Equal(t, pgcodec.IdentityNone, info.Tables[1].Identity)
	require.Empty(t, info.LeftOut)
	require.Equal(t, []string{"public.keyless"}, info.InsertsOnly)

	plain := pgtest.Start(t) // wal_level replica
	src, err := New(Options{DSN: plain.DSN, Schema: e.schema, Positions: e.pos})
	require.NoError(t, err)
	defer src.Close()
	_, err = src.Open(context.Background())
	require.ErrorIs(t, err, ErrNotLogical)

	bad, err := New(Options{DSN: "postgres://nobody@127.0.0.1:1/x?connect_timeout=2", Schema: e.schema, Positions: e.pos})
	require.NoError(t, err)
	defer bad.Close()
	_, err = bad.Open(context.Background())
	require.ErrorIs(t, err, ErrConnect)
	_, err = New(Options{DSN: "x", Schema: e.schema, Positions: e.pos, Slot: "Bad-Name"})
	require.ErrorIs(t, err, ErrInvalidOptions)
}

func testutilValue(c interface{ Write(*dto.Metric) error }) float64 {
	var m dto.Metric
	_ = c.Write(&m)
	return m.GetCounter().GetValue() + m.GetGauge().GetValue()
}

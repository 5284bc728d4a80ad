package pgsink

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap/zaptest"

	"github.com/cdcflow/eventservice/internal/pgtest"
	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// durables records what the sink reports durable (the collector's side
// of the contract, the edge under test).
type durables struct {
	mu  sync.Mutex
	got map[common.DispatcherID]common.Ts
	ch  chan struct{}
}

func newDurables() *durables {
	return &durables{got: map[common.DispatcherID]common.Ts{}, ch: make(chan struct{}, 1)}
}

func (d *durables) record(id common.DispatcherID, _ uint64, ts common.Ts) {
	d.mu.Lock()
	d.got[id] = ts
	d.mu.Unlock()
	select {
	case d.ch <- struct{}{}:
	default:
	}
}

func (d *durables) wait(t testing.TB, id common.DispatcherID, ts common.Ts) {
	t.Helper()
	deadline := time.After(60 * time.Second)
	for {
		d.mu.Lock()
		ok := d.got[id] >= ts
		d.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-d.ch:
		case <-deadline:
			t.Fatalf("%v never durable at %v", id, ts)
		}
	}
}

type sinkEnv struct {
	t    *testing.T
	pg   *pgtest.Server
	conn *pgx.Conn
	sink *Sink
	dur  *durables
}

func newSinkEnv(t *testing.T, tweak func(*Options)) *sinkEnv {
	pg := pgtest.Start(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pg.DSN)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	opts := Options{DSN: pg.DSN, Workers: 2, FlushInterval: 5 * time.Millisecond, CheckpointInterval: 20 * time.Millisecond}
	if tweak != nil {
		tweak(&opts)
	}
	if opts.MaxFlushInterval == 0 {
		// The tests' commit-ts are small numbers, decades behind any
		// clock: without this every lane would stretch its cadence.
		opts.MaxFlushInterval = max(opts.FlushInterval, DefaultFlushInterval)
	}
	s, err := New(opts)
	require.NoError(t, err)
	e := &sinkEnv{t: t, pg: pg, conn: conn, sink: s, dur: newDurables()}
	s.SetDurable(e.dur.record)
	require.NoError(t, s.Start(ctx))
	t.Cleanup(s.Close)
	return e
}

var relT = pgcodec.Relation{OID: 100, Schema: "app", Name: "t", Columns: []pgcodec.Column{
	{Name: "id", Type: "integer", TypeOID: 23, Key: true}, {Name: "v", Type: "text", TypeOID: 25}, {Name: "big", Type: "text", TypeOID: 25}}}

func tx(c pgcodec.Change, cols ...pgcodec.Datum) pgcodec.RowChange {
	return pgcodec.RowChange{Change: c, Columns: cols}
}
func col(name, v string) pgcodec.Datum {
	return pgcodec.Datum{Name: name, Kind: pgcodec.Text, Text: []byte(v)}
}
func null(name string) pgcodec.Datum      { return pgcodec.Datum{Name: name, Kind: pgcodec.Null} }
func unchanged(name string) pgcodec.Datum { return pgcodec.Datum{Name: name, Kind: pgcodec.Unchanged} }

// rows encodes changes of one transaction at ts, keyed by their first
// column.
func rows(ts common.Ts, changes ...pgcodec.RowChange) []common.Row {
	out := make([]common.Row, len(changes))
	for i, c := range changes {
		var key [][]byte
		if len(c.Columns) > 0 {
			key = [][]byte{c.Columns[0].Text}
		}
		out[i] = common.Row{Op: pgcodec.Op(c.Change), Key: pgcodec.AppendKey(nil, uint32(i+1), key),
			Value: pgcodec.AppendValue(nil, c), StartTs: ts - 1, CommitTs: ts}
	}
	return out
}

// firstRow binds id to relT, begins its first epoch at 10 and hands the
// sink one row of relT at 12 with its checkpoint (not yet durable).
func (e *sinkEnv) firstRow(id common.DispatcherID) {
	e.t.Helper()
	require.NoError(e.t, e.sink.Bind(context.Background(), id, relT, 10))
	require.NoError(e.t, e.sink.BeginEpoch(id, 1, 10))
	require.NoError(e.t, e.sink.ApplyRows(id, rows(12, tx(pgcodec.Insert, col("id", "1"), col("v", "a"), null("big")))))
	require.NoError(e.t, e.sink.Checkpoint(id, 12))
}

func (e *sinkEnv) contents(table string) []string {
	e.t.Helper()
	rs, err := e.conn.Query(context.Background(), "SELECT row_to_json(x)::text FROM "+table+" x")
	require.NoError(e.t, err)
	defer rs.Close()
	var out []string
	for rs.Next() {
		var s string
		require.NoError(e.t, rs.Scan(&s))
		out = append(out, s)
	}
	require.NoError(e.t, rs.Err())
	sort.Strings(out)
	return out
}

// Inserts, updates, deletes and a truncate of one dispatcher reach the
// target in order; an update that left a TOASTed column unchanged keeps
// the old value, whether an earlier change of the same batch gave it or
// the target had it; the checkpoint is durable with the rows and written
// to cdcflow.checkpoints.
func TestChangesAreAppliedInOrderAndCheckpointed(t *testing.T) {
	e := newSinkEnv(t, nil)
	id := common.DispatcherIDFromUint64(1)
	require.NoError(t, e.sink.Bind(context.Background(), id, relT, 10))
	require.NoError(t, e.sink.BeginEpoch(id, 1, 10))
	require.NoError(t, e.sink.ApplyRows(id, rows(12,
		tx(pgcodec.Insert, col("id", "1"), col("v", "a"), col("big", "BIG1")),
		tx(pgcodec.Insert, col("id", "2"), col("v", "b"), col("big", "BIG2")),
		tx(pgcodec.Update, col("id", "1"), col("v", "a2"), unchanged("big")))))
	require.NoError(t, e.sink.Checkpoint(id, 12))
	e.dur.wait(t, id, 12)
	require.Equal(t, []string{`{"id":1,"v":"a2","big":"BIG1"}`, `{"id":2,"v":"b","big":"BIG2"}`}, e.contents("app.t"))

	require.NoError(t, e.sink.ApplyRows(id, rows(14,
		tx(pgcodec.Update, col("id", "2"), null("v"), unchanged("big")),
		tx(pgcodec.Delete, col("id", "1")),
		tx(pgcodec.Insert, col("id", "3"), col("v", "c"), col("big", "BIG3")))))
	require.NoError(t, e.sink.Checkpoint(id, 14))
	e.dur.wait(t, id, 14)
	require.Equal(t, []string{`{"id":2,"v":null,"big":"BIG2"}`, `{"id":3,"v":"c","big":"BIG3"}`}, e.contents("app.t"),
		"the target's TOASTed value kept")

	require.NoError(t, e.sink.ApplyRows(id, rows(16,
		tx(pgcodec.Insert, col("id", "4"), col("v", "gone"), null("big")),
		pgcodec.RowChange{Change: pgcodec.Truncate},
		tx(pgcodec.Insert, col("id", "5"), col("v", "after"), null("big")))))
	require.NoError(t, e.sink.Checkpoint(id, 16))
	e.dur.wait(t, id, 16)
	require.Equal(t, []string{`{"id":5,"v":"after","big":null}`}, e.contents("app.t"), "the truncate in its place")
	ckpts, err := e.sink.Checkpoints(context.Background())
	require.NoError(t, err)
	require.Equal(t, common.Ts(16), ckpts[id])
	ts, ok := e.sink.MinDurable()
	require.True(t, ok)
	require.Equal(t, common.Ts(16), ts)
}

// Batches of one to four rows, on a table with a composite key, whichever
// statement form carries them (VALUES up to valuesMaxRows rows, unnested
// arrays above): inserts with a NULL, updates that leave a TOASTed column
// unchanged, and deletes give the same target; values that an array
// literal would take for its syntax (quotes, backslashes, braces, commas,
// the word NULL) and an empty string arrive as themselves, in keys too.
func TestEveryStatementFormAppliesTheSameChanges(t *testing.T) {
	e := newSinkEnv(t, nil)
	relC := pgcodec.Relation{OID: 300, Schema: "app", Name: "c", Columns: []pgcodec.Column{
		{Name: "a", Type: "integer", TypeOID: 23, Key: true}, {Name: "b", Type: "text", TypeOID: 25, Key: true},
		{Name: "v", Type: "text", TypeOID: 25}, {Name: "big", Type: "text", TypeOID: 25}}}
	id := common.DispatcherIDFromUint64(1)
	require.NoError(t, e.sink.Bind(context.Background(), id, relC, 10))
	require.NoError(t, e.sink.BeginEpoch(id, 1, 10))
	ts := common.Ts(10)
	apply := func(changes ...pgcodec.RowChange) {
		t.Helper()
		ts += 2
		rs := make([]common.Row, len(changes))
		for i, c := range changes {
			key := [][]byte{c.Columns[0].Text, c.Columns[1].Text}
			rs[i] = common.Row{Op: pgcodec.Op(c.Change), Key: pgcodec.AppendKey(nil, uint32(i+1), key),
				Value: pgcodec.AppendValue(nil, c), StartTs: ts - 1, CommitTs: ts}
		}
		require.NoError(t, e.sink.ApplyRows(id, rs))
		require.NoError(t, e.sink.Checkpoint(id, ts))
		e.dur.wait(t, id, ts)
	}
	odd := []string{`v"{a,b}\`, "", "NULL", ` {"x"} `}
	js := func(s string) string { b, err := json.Marshal(s); require.NoError(t, err); return string(b) }
	var want []string
	for n := 1; n <= 4; n++ {
		var ins, upd, del []pgcodec.RowChange
		for i := range n {
			a := strconv.Itoa(10*n + i)
			b, v := `k"`+a+`,\`, odd[i]
			ins = append(ins, tx(pgcodec.Insert, col("a", a), col("b", b), null("v"), col("big", "BIG"+a)))
			upd = append(upd, tx(pgcodec.Update, col("a", a), col("b", b), col("v", v), unchanged("big")))
			del = append(del, tx(pgcodec.Delete, col("a", a), col("b", b)))
			want = append(want, fmt.Sprintf(`{"a":%s,"b":%s,"v":%s,"big":"BIG%s"}`, a, js(b), js(v), a))
		}
		apply(ins...)
		apply(upd...)
		sort.Strings(want)
		require.Equal(t, want, e.contents("app.c"), "%d rows a statement", n)
		apply(del...)
		want = nil
		require.Empty(t, e.contents("app.c"), "%d deletes a statement", n)
	}
}

// A dispatcher's checkpoint is written with its rows; one whose work is
// checkpoints only is not written at every commit of its lane, only once
// CheckpointInterval has passed since its last write (its first at once).
func TestIdleCheckpointsWaitForTheirInterval(t *testing.T) {
	ctx := context.Background()
	busy, idle := common.DispatcherIDFromUint64(1), common.DispatcherIDFromUint64(2)
	relU := pgcodec.Relation{OID: 200, Schema: "app", Name: "u", Columns: relT.Columns[:2]}
	start := func(e *sinkEnv) {
		require.NoError(t, e.sink.Bind(ctx, busy, relT, 10))
		require.NoError(t, e.sink.Bind(ctx, idle, relU, 10))
		for _, d := range []common.DispatcherID{busy, idle} {
			require.NoError(t, e.sink.BeginEpoch(d, 1, 10))
		}
		require.NoError(t, e.sink.Checkpoint(idle, 11))
		e.dur.wait(t, idle, 11) // never written before: written at once
	}

	e := newSinkEnv(t, func(o *Options) { o.Workers = 1; o.CheckpointInterval = time.Hour })
	start(e)
	require.NoError(t, e.sink.Checkpoint(idle, 12))
	require.NoError(t, e.sink.ApplyRows(busy, rows(13, tx(pgcodec.Insert, col("id", "1"), col("v", "a"), null("big")))))
	require.NoError(t, e.sink.Checkpoint(busy, 13))
	e.dur.wait(t, busy, 13)
	ckpts, err := e.sink.Checkpoints(ctx)
	require.NoError(t, err)
	require.Equal(t, map[common.DispatcherID]common.Ts{busy: 13, idle: 11}, ckpts, "the idle checkpoint waits for its interval")
	require.NoError(t, e.sink.ApplyRows(idle, rows(14, tx(pgcodec.Insert, col("id", "1"), col("v", "b")))))
	require.NoError(t, e.sink.Checkpoint(idle, 14))
	e.dur.wait(t, idle, 14) // with its rows, at once

	e = newSinkEnv(t, func(o *Options) { o.Workers = 1 }) // CheckpointInterval 20ms
	start(e)
	require.NoError(t, e.sink.Checkpoint(idle, 12))
	e.dur.wait(t, idle, 12)
	ckpts, err = e.sink.Checkpoints(ctx)
	require.NoError(t, err)
	require.Equal(t, common.Ts(12), ckpts[idle])
}

// A lane's flush cadence runs on the sink's clock: rows it holds are
// committed once the injected clock passes FlushInterval, not before.
func TestLaneFlushesOnTheInjectedClock(t *testing.T) {
	fake := clock.NewFake(time.Unix(1_800_000_000, 0))
	e := newSinkEnv(t, func(o *Options) { o.Workers = 1; o.FlushInterval = time.Hour; o.Clock = fake })
	ctx := context.Background()
	id := common.DispatcherIDFromUint64(1)
	e.firstRow(id)
	// The lane holds the rows and waits for its flush deadline.
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(t, fake.WaitWaiters(wctx, 1))
	e.dur.mu.Lock()
	_, early := e.dur.got[id]
	e.dur.mu.Unlock()
	require.False(t, early, "committed before the clock reached the flush deadline")
	require.Empty(t, e.contents("app.t"))
	fake.Advance(time.Hour)
	e.dur.wait(t, id, 12)
	require.Equal(t, []string{`{"id":1,"v":"a","big":null}`}, e.contents("app.t"))
}

// TestLaneStretchesItsCadenceWhileBehind: while rows far behind the clock
// (more than four MaxFlushIntervals) keep arriving, the lane holds them
// until MaxFlushInterval after its last commit, so a backlog goes in larger
// statements; once they stop arriving it commits FlushInterval after the
// last (the end of a backlog does not wait out the stretch); rows less far
// behind wait FlushInterval. Each deadline the lane arms is read off the
// injected clock.
func TestLaneStretchesItsCadenceWhileBehind(t *testing.T) {
	const flush, maxFlush = 100 * time.Millisecond, time.Second
	fake := clock.NewFake(time.Unix(1_800_000_000, 0))
	e := newSinkEnv(t, func(o *Options) {
		o.Workers, o.Clock, o.FlushInterval, o.MaxFlushInterval, o.CheckpointInterval = 1, fake, flush, maxFlush, time.Hour
	})
	ctx := context.Background()
	id := common.DispatcherIDFromUint64(1)
	require.NoError(t, e.sink.Bind(ctx, id, relT, 10))
	require.NoError(t, e.sink.BeginEpoch(id, 1, 10))
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	lastCommit := fake.Now() // the lane's start counts as its last commit
	var lastTs common.Ts
	n := 0
	// apply queues one row committed behind the clock (each above the one
	// before, as the stream's are) and waits until the lane armed want.
	apply := func(behind, want time.Duration) {
		t.Helper()
		n++
		lastTs = max(lastTs+1, common.TsFromTime(fake.Now().Add(-behind)))
		require.NoError(t, e.sink.ApplyRows(id, rows(lastTs, tx(pgcodec.Insert, col("id", strconv.Itoa(n)), col("v", "a"), null("big")))))
		require.NoError(t, e.sink.Checkpoint(id, lastTs))
		for {
			due, ok := fake.NextDue()
			if ok && due == want {
				return
			}
			require.NoError(t, wctx.Err(), "the lane never armed %v (last seen %v, %v)", want, due, ok)
			runtime.Gosched()
		}
	}
	durable := func() common.Ts { return e.sink.Durable(id) }

	// A backlog keeps arriving, a row every 60 ms: each re-arms the quiet
	// deadline (100 ms after it) until the cap, 1 s after the last commit.
	for {
		left := lastCommit.Add(maxFlush).Sub(fake.Now())
		apply(40*time.Second, min(flush, left))
		require.Less(t, durable(), lastTs, "committed before the stretch ran out")
		if left <= 60*time.Millisecond {
			fake.Advance(left)
			break
		}
		fake.Advance(60 * time.Millisecond)
	}
	e.dur.wait(t, id, lastTs)
	lastCommit = fake.Now()

	// Far behind, but nothing follows: committed FlushInterval after it.
	apply(40*time.Second, flush)
	fake.Advance(flush)
	e.dur.wait(t, id, lastTs)

	// Behind, not far; then keeping up: FlushInterval after the last commit.
	for _, behind := range []time.Duration{3 * time.Second, 50 * time.Millisecond} {
		apply(behind, flush)
		fake.Advance(flush)
		e.dur.wait(t, id, lastTs)
	}
	require.Len(t, e.contents("app.t"), n)
}

// Schema changes are carried to the target before the rows that use them
// (evolve.go): a column added, renamed (told from a drop and an add by its
// place, or by its number), retyped and dropped, the table renamed and
// moved to another schema, and its key changed; another table goes on
// throughout. A change the versions cannot tell apart (the last column
// gone and another new, without numbers) stops the table, saying so: its
// calls are accepted and dropped, its checkpoint stays.
func TestSchemaChangesAreCarried(t *testing.T) {
	e := newSinkEnv(t, func(o *Options) { o.Logger = zaptest.NewLogger(t) })
	ctx := context.Background()
	id, other := common.DispatcherIDFromUint64(1), common.DispatcherIDFromUint64(2)
	relU := pgcodec.Relation{OID: 200, Schema: "app", Name: "u", Columns: relT.Columns[:2]}
	require.NoError(t, e.sink.Bind(ctx, id, relT, 10))
	require.NoError(t, e.sink.Bind(ctx, other, relU, 10))
	for _, d := range []common.DispatcherID{id, other} {
		require.NoError(t, e.sink.BeginEpoch(d, 1, 10))
	}
	ts := common.Ts(10)
	step := func(rel pgcodec.Relation, row ...pgcodec.Datum) {
		t.Helper()
		require.NoError(t, e.sink.ApplyDDL(id, &messaging.DDL{TableID: 100, CommitTs: ts + 1, Query: pgcodec.RelationDDL(rel)}))
		require.NoError(t, e.sink.ApplyRows(id, rows(ts+2, tx(pgcodec.Insert, row...))))
		require.NoError(t, e.sink.Checkpoint(id, ts+2))
		require.NoError(t, e.sink.ApplyRows(other, rows(ts+2, tx(pgcodec.Insert, col("id", fmt.Sprint(uint64(ts))), col("v", "z")))))
		require.NoError(t, e.sink.Checkpoint(other, ts+2))
		ts += 2
		e.dur.wait(t, id, ts)
		e.dur.wait(t, other, ts)
		require.Empty(t, e.sink.Stopped())
	}
	cols := func(cs ...pgcodec.Column) []pgcodec.Column { return cs }
	id_ := pgcodec.Column{Name: "id", Type: "integer", TypeOID: 23, Key: true}
	extra := pgcodec.Column{Name: "extra", Type: "character varying(12)", TypeOID: 1043}
	rel := relT
	rel.Columns = cols(id_, relT.Columns[1], relT.Columns[2], extra)
	step(rel, col("id", "1"), col("v", "a"), null("big"), col("extra", "x"))

	rel.Columns = cols(id_, pgcodec.Column{Name: "w", Type: "text", TypeOID: 25}, relT.Columns[2], extra) // v renamed w: its place and type
	step(rel, col("id", "2"), col("w", "b"), null("big"), col("extra", "y"))
	rel.Columns[3] = pgcodec.Column{Name: "extra", Type: "text", TypeOID: 25} // retyped
	step(rel, col("id", "3"), col("w", "c"), null("big"), col("extra", "a longer text than twelve"))
	rel.Columns = cols(id_, rel.Columns[1], rel.Columns[3]) // big dropped
	step(rel, col("id", "4"), col("w", "d"), col("extra", "z"))
	rel.Schema, rel.Name = "archive", "t_old" // renamed and moved
	step(rel, col("id", "5"), col("w", "e"), col("extra", "q"))
	rel.Columns[1].Key = true // the key is (id, w) now
	step(rel, col("id", "5"), col("w", "e2"), col("extra", "same id, another key"))
	require.Equal(t, []string{`{"id":1,"w":"a","extra":"x"}`, `{"id":2,"w":"b","extra":"y"}`, `{"id":3,"w":"c","extra":"a longer text than twelve"}`,
		`{"id":4,"w":"d","extra":"z"}`, `{"id":5,"w":"e","extra":"q"}`, `{"id":5,"w":"e2","extra":"same id, another key"}`}, e.contents("archive.t_old"))
	var n int
	require.NoError(t, e.conn.QueryRow(ctx, "SELECT count(*) FROM pg_class WHERE relname = 't' AND relnamespace = 'app'::regnamespace").Scan(&n))
	require.Zero(t, n, "the old name is gone")

	// The last column gone and another new: renamed, or dropped and
	// added? Without numbers nothing tells.
	amb := rel
	amb.Columns = cols(rel.Columns[0], rel.Columns[1], pgcodec.Column{Name: "extra2", Type: "text", TypeOID: 25})
	require.NoError(t, e.sink.ApplyDDL(id, &messaging.DDL{TableID: 100, CommitTs: ts + 1, Query: pgcodec.RelationDDL(amb)}))
	require.NoError(t, e.sink.ApplyRows(id, rows(ts+2, tx(pgcodec.Insert, col("id", "6"), col("w", "f"), col("extra2", "?")))))
	require.NoError(t, e.sink.Checkpoint(id, ts+2))
	testwait.Within(t, 60*time.Second, "the table stopped", func() bool { return len(e.sink.Stopped()) == 1 })
	require.Contains(t, e.sink.Stopped()[0], `renamed, or dropped and added?`)
	require.NoError(t, e.sink.ApplyRows(id, rows(ts+4, tx(pgcodec.Insert, col("id", "7")))), "a stopped table's calls are accepted")
	require.Equal(t, ts, e.sink.Durable(id), "and its checkpoint stays")

	// With the columns' numbers the same change is a rename.
	e2 := newSinkEnv(t, nil)
	num := func(r pgcodec.Relation) pgcodec.Relation {
		r.Columns = slices.Clone(r.Columns)
		for i := range r.Columns {
			r.Columns[i].Num = int16(i + 1)
		}
		return r
	}
	base := num(pgcodec.Relation{OID: 300, Schema: "app", Name: "n", Columns: cols(id_, pgcodec.Column{Name: "last", Type: "text", TypeOID: 25})})
	require.NoError(t, e2.sink.Bind(ctx, id, base, 10))
	require.NoError(t, e2.sink.BeginEpoch(id, 1, 10))
	require.NoError(t, e2.sink.ApplyRows(id, rows(12, tx(pgcodec.Insert, col("id", "1"), col("last", "kept")))))
	renamed := num(base)
	renamed.Columns[1].Name = "final"
	require.NoError(t, e2.sink.ApplyDDL(id, &messaging.DDL{TableID: 300, CommitTs: 13, Query: pgcodec.RelationDDL(renamed)}))
	require.NoError(t, e2.sink.ApplyRows(id, rows(14, tx(pgcodec.Insert, col("id", "2"), col("final", "new")))))
	require.NoError(t, e2.sink.Checkpoint(id, 14))
	e2.dur.wait(t, id, 14)
	require.Equal(t, []string{`{"id":1,"final":"kept"}`, `{"id":2,"final":"new"}`}, e2.contents("app.n"), "the last column renamed, its values kept")

	// Two columns swap names; then one is dropped and added again under
	// its name (a new number: its old values gone).
	two := renamed
	two.Columns = append(slices.Clone(renamed.Columns), pgcodec.Column{Name: "other", Type: "text", TypeOID: 25, Num: 3})
	require.NoError(t, e2.sink.ApplyDDL(id, &messaging.DDL{TableID: 300, CommitTs: 15, Query: pgcodec.RelationDDL(two)}))
	require.NoError(t, e2.sink.ApplyRows(id, rows(16, tx(pgcodec.Insert, col("id", "3"), col("final", "f3"), col("other", "o3")))))
	swapped := two
	swapped.Columns = slices.Clone(two.Columns)
	swapped.Columns[1].Name, swapped.Columns[2].Name = "other", "final"
	require.NoError(t, e2.sink.ApplyDDL(id, &messaging.DDL{TableID: 300, CommitTs: 17, Query: pgcodec.RelationDDL(swapped)}))
	require.NoError(t, e2.sink.ApplyRows(id, rows(18, tx(pgcodec.Insert, col("id", "4"), col("other", "o4"), col("final", "f4")))))
	again := swapped
	again.Columns = slices.Clone(swapped.Columns)
	again.Columns[2].Num = 4 // "final" dropped and added again
	require.NoError(t, e2.sink.ApplyDDL(id, &messaging.DDL{TableID: 300, CommitTs: 19, Query: pgcodec.RelationDDL(again)}))
	require.NoError(t, e2.sink.ApplyRows(id, rows(20, tx(pgcodec.Insert, col("id", "5"), col("other", "o5"), col("final", "f5")))))
	require.NoError(t, e2.sink.Checkpoint(id, 20))
	e2.dur.wait(t, id, 20)
	require.Empty(t, e2.sink.Stopped())
	require.Equal(t, []string{`{"id":1,"other":"kept","final":null}`, `{"id":2,"other":"new","final":null}`, `{"id":3,"other":"f3","final":null}`,
		`{"id":4,"other":"o4","final":null}`, `{"id":5,"other":"o5","final":"f5"}`}, e2.contents("app.n"),
		"the swap kept each column's values under its new name; the column added again holds only what came after")
}

// A column added with a constant default reaches the rows the target
// already holds with the value the source's rows hold (no row change says
// so), and leaves no default behind; a column of a created type is added
// as its base type, and a relation version naming the created type still
// matches it.
func TestAnAddedColumnGivesTheRowsThereTheirValue(t *testing.T) {
	e := newSinkEnv(t, nil)
	ctx := context.Background()
	id := common.DispatcherIDFromUint64(1)
	require.NoError(t, e.sink.Bind(ctx, id, relT, 10))
	require.NoError(t, e.sink.BeginEpoch(id, 1, 10))
	require.NoError(t, e.sink.ApplyRows(id, rows(11, tx(pgcodec.Insert, col("id", "1"), col("v", "a"), null("big")))))
	added := relT
	added.Columns = append(append([]pgcodec.Column(nil), relT.Columns...),
		pgcodec.Column{Name: "status", Type: "mood", TypeOID: 16385, Base: "text", Missing: `it's \ ok`, HasMissing: true},
		pgcodec.Column{Name: "n", Type: "integer", TypeOID: 23, Missing: "42", HasMissing: true},
		pgcodec.Column{Name: "plain", Type: "integer", TypeOID: 23})
	require.NoError(t, e.sink.ApplyDDL(id, &messaging.DDL{TableID: 100, CommitTs: 12, Query: pgcodec.RelationDDL(added)}))
	require.NoError(t, e.sink.ApplyRows(id, rows(13, tx(pgcodec.Insert, col("id", "2"), col("v", "b"), null("big"),
		col("status", "sad"), col("n", "7"), null("plain")))))
	again := added // the same version read again (a reconnect): nothing to do
	require.NoError(t, e.sink.ApplyDDL(id, &messaging.DDL{TableID: 100, CommitTs: 14, Query: pgcodec.RelationDDL(again)}))
	require.NoError(t, e.sink.Checkpoint(id, 14))
	e.dur.wait(t, id, 14)
	require.Empty(t, e.sink.Stopped())
	require.Equal(t, []string{
		`{"id":1,"v":"a","big":null,"status":"it's \\ ok","n":42,"plain":null}`,
		`{"id":2,"v":"b","big":null,"status":"sad","n":7,"plain":null}`,
	}, e.contents("app.t"))
	var defaults int
	require.NoError(t, e.conn.QueryRow(ctx, "SELECT count(*) FROM pg_attrdef WHERE adrelid = 'app.t'::regclass").Scan(&defaults))
	require.Zero(t, defaults, "every value comes from the source")
}

// move is a row that changes the key from `from` to the first column of
// cols, its TOASTed big column left unchanged.
func move(from string, cols ...pgcodec.Datum) pgcodec.RowChange {
	return pgcodec.RowChange{Change: pgcodec.Move, Columns: append(cols, unchanged("big")), From: []pgcodec.Datum{col("id", from)}}
}

// An update that changed a row's key and left its TOASTed column unchanged
// (a move) gives the new row the old row's value, whether the target holds
// the old row or an earlier change of the same batch gave it, and deletes
// the old row; a move from a row the target lacks gives the new row what
// nothing holds, NULL, and is not lost.
func TestAMoveKeepsTheUnchangedValue(t *testing.T) {
	e := newSinkEnv(t, nil)
	ctx := context.Background()
	id := common.DispatcherIDFromUint64(1)
	require.NoError(t, e.sink.Bind(ctx, id, relT, 10))
	require.NoError(t, e.sink.BeginEpoch(id, 1, 10))
	require.NoError(t, e.sink.ApplyRows(id, rows(11, tx(pgcodec.Insert, col("id", "1"), col("v", "a"), col("big", "B1")))))
	require.NoError(t, e.sink.Checkpoint(id, 11))
	e.dur.wait(t, id, 11)
	require.NoError(t, e.sink.ApplyRows(id, rows(12,
		move("1", col("id", "2"), col("v", "moved")), // from the target's row
		tx(pgcodec.Insert, col("id", "5"), col("v", "c"), col("big", "B5")),
		move("5", col("id", "6"), col("v", "moved too")), // from the batch's
		move("9", col("id", "10"), null("v")),            // from nothing
	)))
	require.NoError(t, e.sink.Checkpoint(id, 12))
	e.dur.wait(t, id, 12)
	require.Equal(t, []string{
		`{"id":10,"v":null,"big":null}`,
		`{"id":2,"v":"moved","big":"B1"}`,
		`{"id":6,"v":"moved too","big":"B5"}`,
	}, e.contents("app.t"))
	require.Empty(t, e.sink.Stopped())
}

// A table dropped at the source and created again under the same name is
// another table (another OID) whose target table already holds the first
// one's rows: while the first is bound it stops, naming both, rather than
// mix its rows into them; the first table's work goes on, and binding the
// same table again is no conflict. Once the first has left the changefeed
// (a later start, SetLeft) the target table is emptied for the new one.
func TestATargetTableOfAnotherSourceTableStopsTheNewOne(t *testing.T) {
	e := newSinkEnv(t, nil)
	ctx := context.Background()
	old, recreated := common.DispatcherIDFromUint64(1), common.DispatcherIDFromUint64(2)
	require.NoError(t, e.sink.Bind(ctx, old, relT, 10))
	require.NoError(t, e.sink.BeginEpoch(old, 1, 10))
	require.NoError(t, e.sink.ApplyRows(old, rows(11, tx(pgcodec.Insert, col("id", "1"), col("v", "old"), null("big")))))
	require.NoError(t, e.sink.Checkpoint(old, 11))
	e.dur.wait(t, old, 11)
	require.NoError(t, e.sink.Bind(ctx, old, relT, 11), "the same table bound again")
	require.Empty(t, e.sink.Stopped())

	again := relT
	again.OID = 101
	require.NoError(t, e.sink.Bind(ctx, recreated, again, 12))
	require.Len(t, e.sink.Stopped(), 1)
	require.Contains(t, e.sink.Stopped()[0], ErrTargetTaken.Error())
	require.Contains(t, e.sink.Stopped()[0], `"app"."t" holds the rows of source table 100, not of 101`)
	require.NoError(t, e.sink.ApplyRows(recreated, rows(13, tx(pgcodec.Insert, col("id", "9"), col("v", "new"), null("big")))),
		"a stopped table's calls are accepted")
	require.NoError(t, e.sink.ApplyRows(old, rows(14, tx(pgcodec.Insert, col("id", "2"), col("v", "old"), null("big")))))
	require.NoError(t, e.sink.Checkpoint(old, 14))
	e.dur.wait(t, old, 14)
	require.Equal(t, []string{`{"id":1,"v":"old","big":null}`, `{"id":2,"v":"old","big":null}`}, e.contents("app.t"),
		"nothing of the new table's mixed in")

	// A later process, to which the first table has left the changefeed
	// (dropped: no longer published), empties the target table for the
	// new one and forgets the old checkpoint; without being told, it
	// stops the new table as this one did.
	later := func(left func(uint32) bool) *Sink {
		s2, err := New(Options{DSN: e.pg.DSN, Workers: 2, FlushInterval: 5 * time.Millisecond, MaxFlushInterval: DefaultFlushInterval})
		require.NoError(t, err)
		if left != nil {
			s2.SetLeft(left)
		}
		require.NoError(t, s2.Start(ctx))
		t.Cleanup(s2.Close)
		require.NoError(t, s2.BindAll(ctx, []Binding{{ID: recreated, Rel: again, StartTs: 12}}))
		return s2
	}
	e.sink.Close()
	require.Len(t, later(nil).Stopped(), 1, "not told that the first table left")
	require.Empty(t, later(func(oid uint32) bool { return oid == 100 }).Stopped())
	require.Empty(t, e.contents("app.t"), "emptied for the new table")
	var rows int
	require.NoError(t, e.conn.QueryRow(ctx, "SELECT count(*) FROM cdcflow.checkpoints WHERE table_oid = 100").Scan(&rows))
	require.Zero(t, rows, "the old table's checkpoint is gone with it")
}

// Changes the target refuses (a value its type cannot take) fail only
// their dispatcher, at its next call, with nothing of them applied; the
// reset (BeginEpoch) clears it and the other tables of the lane commit.
func TestARefusedChangeFailsOnlyItsTable(t *testing.T) {
	e := newSinkEnv(t, func(o *Options) { o.Workers = 1 })
	ctx := context.Background()
	bad, good := common.DispatcherIDFromUint64(1), common.DispatcherIDFromUint64(2)
	relU := pgcodec.Relation{OID: 200, Schema: "app", Name: "u", Columns: relT.Columns[:2]}
	require.NoError(t, e.sink.Bind(ctx, bad, relT, 10))
	require.NoError(t, e.sink.Bind(ctx, good, relU, 10))
	for _, d := range []common.DispatcherID{bad, good} {
		require.NoError(t, e.sink.BeginEpoch(d, 1, 10))
	}
	require.NoError(t, e.sink.ApplyRows(bad, rows(12, tx(pgcodec.Insert, col("id", "not a number"), col("v", "a"), null("big")))))
	require.NoError(t, e.sink.Checkpoint(bad, 12))
	require.NoError(t, e.sink.ApplyRows(good, rows(12, tx(pgcodec.Insert, col("id", "1"), col("v", "ok")))))
	require.NoError(t, e.sink.Checkpoint(good, 12))
	e.dur.wait(t, good, 12)
	var err error
	testwait.Within(t, 60*time.Second, "the refused change reported on the next call", func() bool {
		err = e.sink.Checkpoint(bad, 13)
		return err != nil
	})
	require.ErrorIs(t, err, ErrApply)
	require.True(t, strings.Contains(err.Error(), "integer"), err.Error())
	require.Equal(t, common.Ts(10), e.sink.Durable(bad))
	require.Empty(t, e.contents("app.t"))
	require.NoError(t, e.sink.BeginEpoch(bad, 2, 10), "the reset")
	require.NoError(t, e.sink.ApplyRows(bad, rows(12, tx(pgcodec.Insert, col("id", "7"), col("v", "a"), null("big")))))
	require.NoError(t, e.sink.Checkpoint(bad, 12))
	e.dur.wait(t, bad, 12)
	require.Equal(t, []string{`{"id":7,"v":"a","big":null}`}, e.contents("app.t"))
}

// The target going away is nobody's fault: the lane keeps its work,
// connects again and applies it; no table is stopped, and the checkpoint
// is durable only once the target holds the rows.
func TestTargetDownIsRetriedNotStopped(t *testing.T) {
	e := newSinkEnv(t, func(o *Options) { o.MaxFailures = 1 })
	id := common.DispatcherIDFromUint64(1)
	require.NoError(t, e.sink.Bind(context.Background(), id, relT, 10))
	require.NoError(t, e.sink.BeginEpoch(id, 1, 10))
	require.NoError(t, e.pg.Stop())
	require.NoError(t, e.sink.ApplyRows(id, rows(12, tx(pgcodec.Insert, col("id", "1"), col("v", "a"), null("big")))))
	require.NoError(t, e.sink.Checkpoint(id, 12))
	testwait.Within(t, 60*time.Second, "the lane sees the target gone", func() bool { return !e.sink.Connected() })
	require.Equal(t, common.Ts(10), e.sink.Durable(id))
	require.NoError(t, e.pg.Restart())
	e.dur.wait(t, id, 12)
	require.Empty(t, e.sink.Stopped())
	conn, err := pgx.Connect(context.Background(), e.pg.DSN)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	e.conn = conn
	require.Equal(t, []string{`{"id":1,"v":"a","big":null}`}, e.contents("app.t"))
}

// A lane's failed commit reads its tables again: a table whose target is
// unchanged keeps its statements (forgetting them would prepare them
// again under new names and leave the old ones prepared, at every
// failure); one whose target changed forgets them.
func TestAReloadKeepsTheStatementsOfAnUnchangedTable(t *testing.T) {
	e := newSinkEnv(t, func(o *Options) { o.Workers = 1 })
	ctx := context.Background()
	id := common.DispatcherIDFromUint64(1)
	e.firstRow(id)
	e.dur.wait(t, id, 12)
	e.sink.Close() // the lane goroutine is done with its state
	l := e.sink.laneFor(relT.OID)
	d := l.mu.states[id]
	st := d.table.last[0][formOne].st
	require.NotNil(t, st, "the insert's statement")
	// reloadTables reads through the sink's context, cancelled by Close,
	// and connects the admin connection again.
	e.sink.ctx = context.Background()
	defer func() { e.sink.admin.Close(ctx) }()
	l.app.reloadTables([]*dstate{d})
	require.Same(t, st, d.table.last[0][formOne].st, "unchanged: kept")
	_, err := e.conn.Exec(ctx, "ALTER TABLE app.t ADD COLUMN extra text")
	require.NoError(t, err)
	l.app.reloadTables([]*dstate{d})
	require.Nil(t, d.table.last[0][formOne].st, "changed: forgotten")
	require.Contains(t, d.table.order, "extra")
}

package pgsink

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// relK is a table without a key under REPLICA IDENTITY FULL.
var relK = pgcodec.Relation{OID: 200, Schema: "app", Name: "k", Identity: pgcodec.IdentityFull, Columns: []pgcodec.Column{
	{Name: "a", Type: "integer", TypeOID: 23}, {Name: "b", Type: "text", TypeOID: 25}, {Name: "j", Type: "json", TypeOID: 114}}}

// update is a keyless table's update of the row old to the row new.
func update(old, new []pgcodec.Datum) pgcodec.RowChange {
	return pgcodec.RowChange{Change: pgcodec.Update, Columns: new, From: old}
}

func row(cols ...pgcodec.Datum) []pgcodec.Datum { return cols }

// A table without a key gets its changes one by one, in order: inserts
// are never collapsed (duplicate rows stay duplicates), and an update or a
// delete changes one row equal to the old row in every column, a NULL and
// a json value (which has no equality operator) included; of two equal
// rows one changes; one whose old row the target lacks changes nothing.
func TestAKeylessTableGetsEveryChangeInOrder(t *testing.T) {
	e := newSinkEnv(t, nil)
	id := common.DispatcherIDFromUint64(1)
	ctx := context.Background()
	require.NoError(t, e.sink.Bind(ctx, id, relK, 10))
	require.NoError(t, e.sink.BeginEpoch(id, 1, 10))
	dup := row(col("a", "1"), col("b", "x"), col("j", `{"k": [1, 2]}`))
	withNull := row(col("a", "2"), null("b"), col("j", "null"))
	require.NoError(t, e.sink.ApplyRows(id, rows(12,
		tx(pgcodec.Insert, dup...), tx(pgcodec.Insert, dup...), tx(pgcodec.Insert, withNull...),
		tx(pgcodec.Insert, col("a", "3"), col("b", "gone"), null("j")))))
	require.NoError(t, e.sink.Checkpoint(id, 12))
	e.dur.wait(t, id, 12)
	require.Equal(t, []string{`{"a":1,"b":"x","j":{"k": [1, 2]}}`, `{"a":1,"b":"x","j":{"k": [1, 2]}}`, `{"a":2,"b":null,"j":null}`,
		`{"a":3,"b":"gone","j":null}`}, e.contents("app.k"))

	require.NoError(t, e.sink.ApplyRows(id, rows(14,
		update(dup, row(col("a", "1"), col("b", "y"), col("j", `{"k": [1, 2]}`))),
		update(withNull, row(col("a", "2"), col("b", "set"), col("j", "null"))),
		tx(pgcodec.Delete, col("a", "3"), col("b", "gone"), null("j")),
		tx(pgcodec.Delete, col("a", "9"), col("b", "never there"), null("j")))))
	require.NoError(t, e.sink.Checkpoint(id, 14))
	e.dur.wait(t, id, 14)
	require.Equal(t, []string{`{"a":1,"b":"x","j":{"k": [1, 2]}}`, `{"a":1,"b":"y","j":{"k": [1, 2]}}`, `{"a":2,"b":"set","j":null}`},
		e.contents("app.k"), "one of the two equal rows changed; the NULL matched; the missing row changed nothing")

	require.NoError(t, e.sink.ApplyRows(id, rows(16,
		pgcodec.RowChange{Change: pgcodec.Truncate}, tx(pgcodec.Insert, col("a", "4"), null("b"), null("j")))))
	require.NoError(t, e.sink.Checkpoint(id, 16))
	e.dur.wait(t, id, 16)
	require.Equal(t, []string{`{"a":4,"b":null,"j":null}`}, e.contents("app.k"))
}

// A table without columns (CREATE TABLE t ()) holds only a number of
// rows: inserts add them, a delete takes one away.
func TestATableWithoutColumnsCountsItsRows(t *testing.T) {
	e := newSinkEnv(t, nil)
	id := common.DispatcherIDFromUint64(1)
	rel := pgcodec.Relation{OID: 300, Schema: "app", Name: "empty", Identity: pgcodec.IdentityFull, Columns: []pgcodec.Column{}}
	require.NoError(t, e.sink.Bind(context.Background(), id, rel, 10))
	require.NoError(t, e.sink.BeginEpoch(id, 1, 10))
	require.NoError(t, e.sink.ApplyRows(id, rows(12, tx(pgcodec.Insert), tx(pgcodec.Insert), tx(pgcodec.Insert))))
	require.NoError(t, e.sink.ApplyRows(id, rows(14, tx(pgcodec.Delete))))
	require.NoError(t, e.sink.Checkpoint(id, 14))
	e.dur.wait(t, id, 14)
	var n int
	require.NoError(t, e.conn.QueryRow(context.Background(), "SELECT count(*) FROM app.empty").Scan(&n))
	require.Equal(t, 2, n)
}

// A replay never applies a keyless row twice: rows a lane committed
// before any checkpoint covered them (part of a transaction, then the
// process ended) are skipped when the stream sends them again from the
// checkpoint, by the position written with them; the rest are applied.
// Without it every insert committed past the last checkpoint came twice.
func TestAKeylessReplayAppliesEachRowOnce(t *testing.T) {
	e := newSinkEnv(t, nil)
	id := common.DispatcherIDFromUint64(1)
	ctx := context.Background()
	require.NoError(t, e.sink.Bind(ctx, id, relK, 10))
	require.NoError(t, e.sink.BeginEpoch(id, 1, 10))
	first := rows(12, // 12 wholly, then two of 14's three rows
		tx(pgcodec.Insert, col("a", "1"), null("b"), null("j")))
	second := rows(14,
		tx(pgcodec.Insert, col("a", "2"), null("b"), null("j")),
		tx(pgcodec.Insert, col("a", "2"), null("b"), null("j")),
		tx(pgcodec.Insert, col("a", "3"), null("b"), null("j")))
	require.NoError(t, e.sink.ApplyRows(id, first))
	require.NoError(t, e.sink.ApplyRows(id, second[:2]))
	count := func() int {
		var n int
		require.NoError(t, e.conn.QueryRow(ctx, "SELECT count(*) FROM app.k").Scan(&n))
		return n
	}
	testwait.For(t, "the rows committed without a checkpoint", func() bool { return count() == 3 })
	var ts, kts, kindex int64
	require.NoError(t, e.conn.QueryRow(ctx, "SELECT ts, applied_ts, applied_index FROM cdcflow.checkpoints").Scan(&ts, &kts, &kindex))
	require.Equal(t, []int64{13, 14, 2}, []int64{ts, kts, kindex}, "the checkpoint is below the commit a row of which was applied")
	e.sink.Close()

	// A new process resumes from the checkpoint: the stream sends 14's
	// rows again, then 16's.
	s2, err := New(Options{DSN: e.pg.DSN, Workers: 2, FlushInterval: e.sink.opts.FlushInterval,
		CheckpointInterval: e.sink.opts.CheckpointInterval, MaxFlushInterval: e.sink.opts.MaxFlushInterval})
	require.NoError(t, err)
	dur := newDurables()
	s2.SetDurable(dur.record)
	require.NoError(t, s2.Start(ctx))
	defer s2.Close()
	require.NoError(t, s2.Bind(ctx, id, relK, common.Ts(ts)))
	require.NoError(t, s2.BeginEpoch(id, 1, common.Ts(ts)))
	require.NoError(t, s2.ApplyRows(id, second))
	require.NoError(t, s2.ApplyRows(id, rows(16, tx(pgcodec.Insert, col("a", "4"), null("b"), null("j")))))
	require.NoError(t, s2.Checkpoint(id, 16))
	dur.wait(t, id, 16)
	require.Equal(t, []string{`{"a":1,"b":null,"j":null}`, `{"a":2,"b":null,"j":null}`, `{"a":2,"b":null,"j":null}`,
		`{"a":3,"b":null,"j":null}`, `{"a":4,"b":null,"j":null}`}, e.contents("app.k"))
}

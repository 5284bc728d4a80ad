package pgsink

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// A replay never applies a keyed table's row twice either: rows a lane
// committed past its checkpoint (the resolved-ts it had) are skipped when
// a new sink, which took over, reads them again from the checkpoint, so a
// trigger on the target table sees each change once; the rest, a truncate
// among them, are applied. Without the position, the replay upserted them
// again: an UPDATE per row for the trigger.
func TestAKeyedReplayAppliesEachRowOnce(t *testing.T) {
	e := newSinkEnv(t, nil)
	id := common.DispatcherIDFromUint64(1)
	ctx := context.Background()
	require.NoError(t, e.sink.Bind(ctx, id, relT, 10))
	require.NoError(t, e.sink.BeginEpoch(id, 1, 10))
	for _, q := range []string{"CREATE TABLE app.writes (op text, id int)",
		`CREATE FUNCTION app.audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
  INSERT INTO app.writes VALUES (TG_OP, CASE WHEN TG_OP = 'DELETE' THEN OLD.id ELSE NEW.id END); RETURN NULL; END $$`,
		"CREATE TRIGGER audit AFTER INSERT OR UPDATE OR DELETE ON app.t FOR EACH ROW EXECUTE FUNCTION app.audit()"} {
		_, err := e.conn.Exec(ctx, q)
		require.NoError(t, err, q)
	}
	first := rows(12, tx(pgcodec.Insert, col("id", "1"), col("v", "a"), null("big")))
	second := rows(14, // two of 14's three rows before the end
		tx(pgcodec.Insert, col("id", "2"), col("v", "b"), null("big")),
		tx(pgcodec.Insert, col("id", "3"), col("v", "c"), null("big")),
		tx(pgcodec.Update, col("id", "1"), col("v", "a2"), null("big")))
	require.NoError(t, e.sink.ApplyRows(id, first))
	require.NoError(t, e.sink.ApplyRows(id, second[:2]))
	writes := func() []string {
		rows, err := e.conn.Query(ctx, "SELECT op || ' ' || id FROM app.writes ORDER BY ctid")
		require.NoError(t, err)
		out, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		return out
	}
	testwait.For(t, "the rows committed past the checkpoint", func() bool { return len(writes()) == 3 })
	var ts int64
	require.NoError(t, e.conn.QueryRow(ctx, "SELECT ts FROM cdcflow.checkpoints").Scan(&ts))
	require.Less(t, ts, int64(14), "the checkpoint is below the rows of 14 applied")
	e.sink.Close()

	s2, err := New(Options{DSN: e.pg.DSN, Workers: 2, FlushInterval: e.sink.opts.FlushInterval,
		CheckpointInterval: e.sink.opts.CheckpointInterval, MaxFlushInterval: e.sink.opts.MaxFlushInterval})
	require.NoError(t, err)
	dur := newDurables()
	s2.SetDurable(dur.record)
	require.NoError(t, s2.Start(ctx))
	defer s2.Close()
	require.NoError(t, s2.Bind(ctx, id, relT, common.Ts(ts)))
	require.NoError(t, s2.BeginEpoch(id, 1, common.Ts(ts)))
	require.NoError(t, s2.ApplyRows(id, second))
	require.NoError(t, s2.ApplyRows(id, rows(16, tx(pgcodec.Insert, col("id", "4"), col("v", "d"), null("big")))))
	require.NoError(t, s2.Checkpoint(id, 16))
	dur.wait(t, id, 16)
	require.Equal(t, []string{"INSERT 1", "INSERT 2", "INSERT 3", "UPDATE 1", "INSERT 4"}, writes(), "each change once")
	require.Equal(t, []string{`{"id":1,"v":"a2","big":null}`, `{"id":2,"v":"b","big":null}`, `{"id":3,"v":"c","big":null}`,
		`{"id":4,"v":"d","big":null}`}, e.contents("app.t"))
}

package pgsink

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// Once its tables are bound, a lane with nothing due warms them (each
// table's upsert of a whole row prepared and planned, not run): every
// table counted, nothing written, no trigger fired, the owner not marked
// as having written; the rows that follow use the warmed statements and
// arrive as sent.
func TestALaneWarmsItsTablesBeforeTheirFirstRows(t *testing.T) {
	e := newSinkEnv(t, nil)
	// One target table the user created first, with a statement-level
	// trigger: warming must not fire it (an empty INSERT would).
	for _, sql := range []string{"CREATE SCHEMA app", "CREATE TABLE app.fired (at timestamptz)",
		"CREATE TABLE app.w00 (id integer PRIMARY KEY, v text, big text)",
		"CREATE FUNCTION app.note() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN INSERT INTO app.fired VALUES (now()); RETURN NULL; END$$",
		"CREATE TRIGGER note AFTER INSERT OR UPDATE ON app.w00 FOR EACH STATEMENT EXECUTE FUNCTION app.note()"} {
		_, err := e.conn.Exec(context.Background(), sql)
		require.NoError(t, err, sql)
	}
	const n = 20
	binds := make([]Binding, n)
	for i := range binds {
		rel := relT
		rel.OID, rel.Name = uint32(1000+i), fmt.Sprintf("w%02d", i)
		binds[i] = Binding{ID: common.DispatcherIDFromUint64(uint64(1000 + i)), Rel: rel, StartTs: 10}
	}
	require.NoError(t, e.sink.BindAll(context.Background(), binds))
	testwait.Within(t, time.Minute, "every bound table warmed", func() bool { return testutil.ToFloat64(e.sink.met.warmed) == n })
	var written int
	require.NoError(t, e.conn.QueryRow(context.Background(), "SELECT count(*) FROM cdcflow.owners WHERE wrote").Scan(&written))
	require.Zero(t, written, "warming writes nothing")
	require.Empty(t, e.contents("app.fired"), "warming runs no statement: no trigger fires")
	for _, b := range binds {
		require.Empty(t, e.contents(b.Rel.QualifiedName()))
		require.NoError(t, e.sink.BeginEpoch(b.ID, 1, 10))
		require.NoError(t, e.sink.ApplyRows(b.ID, rows(12,
			tx(pgcodec.Insert, col("id", "1"), col("v", "a"), null("big")),
			tx(pgcodec.Insert, col("id", "2"), col("v", "b"), col("big", "B")),
			tx(pgcodec.Insert, col("id", "3"), col("v", "c"), null("big")))))
		require.NoError(t, e.sink.Checkpoint(b.ID, 12))
	}
	for _, b := range binds {
		e.dur.wait(t, b.ID, 12)
		require.Equal(t, []string{`{"id":1,"v":"a","big":null}`, `{"id":2,"v":"b","big":"B"}`, `{"id":3,"v":"c","big":null}`},
			e.contents(b.Rel.QualifiedName()))
	}
	require.Equal(t, float64(n), testutil.ToFloat64(e.sink.met.warmed), "warmed once")
}

// A table that another session holds locked on the target does not hold
// its lane in the warm-up: the warm-up waits for a lock at most
// warmLockTimeout, then stops, and the lane applies the rows of its other
// tables while the lock is held; the locked table's rows go in once it is
// released. Without the bound the lane would wait in the warm-up's
// pipeline for as long as the lock is held, with every table behind it.
func TestALockedTableDoesNotHoldALanesWarmUp(t *testing.T) {
	e := newSinkEnv(t, func(o *Options) { o.Workers = 1 })
	ctx := context.Background()
	_, err := e.conn.Exec(ctx, "CREATE SCHEMA app; CREATE TABLE app.locked (id integer PRIMARY KEY, v text, big text)")
	require.NoError(t, err)
	holder, err := pgx.Connect(ctx, e.pg.DSN)
	require.NoError(t, err)
	defer holder.Close(ctx)
	hold, err := holder.Begin(ctx)
	require.NoError(t, err)
	_, err = hold.Exec(ctx, "LOCK TABLE app.locked IN ACCESS EXCLUSIVE MODE") // as an ALTER TABLE would
	require.NoError(t, err)

	locked, other := relT, relT
	locked.OID, locked.Name = 2000, "locked"
	other.OID, other.Name = 2001, "other"
	lockedID, otherID := common.DispatcherIDFromUint64(2000), common.DispatcherIDFromUint64(2001)
	require.NoError(t, e.sink.BindAll(ctx, []Binding{{ID: lockedID, Rel: locked, StartTs: 10}, {ID: otherID, Rel: other, StartTs: 10}}))
	testwait.Within(t, time.Minute, "the warm-up gives up on the locked table", func() bool { return testutil.ToFloat64(e.sink.met.warmFailures) == 1 })

	require.NoError(t, e.sink.BeginEpoch(otherID, 1, 10))
	require.NoError(t, e.sink.ApplyRows(otherID, rows(12, tx(pgcodec.Insert, col("id", "1"), col("v", "a"), null("big")))))
	require.NoError(t, e.sink.Checkpoint(otherID, 12))
	e.dur.wait(t, otherID, 12)
	require.Equal(t, []string{`{"id":1,"v":"a","big":null}`}, e.contents("app.other"), "the lane applies its other tables meanwhile")

	require.NoError(t, e.sink.BeginEpoch(lockedID, 1, 10))
	require.NoError(t, e.sink.ApplyRows(lockedID, rows(13, tx(pgcodec.Insert, col("id", "2"), col("v", "b"), null("big")))))
	require.NoError(t, e.sink.Checkpoint(lockedID, 13))
	require.NoError(t, hold.Rollback(ctx))
	e.dur.wait(t, lockedID, 13)
	require.Equal(t, []string{`{"id":2,"v":"b","big":null}`}, e.contents("app.locked"), "its rows go in once the lock is released")
	require.Zero(t, testutil.ToFloat64(e.sink.met.warmed), "nothing of the failed pipeline counts as warmed")
}

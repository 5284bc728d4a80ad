package pgsink

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

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
	require.Eventually(t, func() bool { return testutil.ToFloat64(e.sink.met.warmed) == n }, time.Minute, 10*time.Millisecond,
		"every bound table warmed")
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

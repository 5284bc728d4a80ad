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

// Once its tables are bound, a lane with nothing to apply warms them (each
// table's upsert of a whole row prepared and run on no rows): every table
// counted, nothing written, the owner not marked as having written; the
// rows that follow use the warmed statements and arrive as sent.
func TestALaneWarmsItsTablesBeforeTheirFirstRows(t *testing.T) {
	e := newSinkEnv(t, nil)
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

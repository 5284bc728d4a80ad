package pgsink

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
)

// The target's progress records are read back as hostile bytes: a
// checkpoint the sink never writes (a negative ts, which as a Ts would be
// past every commit and make its table resume after all of them) is
// refused with ErrCorruptProgress, not resumed from.
func TestACorruptCheckpointIsRefused(t *testing.T) {
	e := newSinkEnv(t, nil)
	ctx := context.Background()
	id := common.DispatcherIDFromUint64(1)
	e.firstRow(id)
	e.dur.wait(t, id, 12)
	got, err := e.sink.Checkpoints(ctx)
	require.NoError(t, err)
	require.Equal(t, common.Ts(12), got[id])
	_, err = e.conn.Exec(ctx, "UPDATE cdcflow.checkpoints SET ts = -1 WHERE dispatcher = $1", hexID(id))
	require.NoError(t, err)
	_, err = e.sink.Checkpoints(ctx)
	require.ErrorIs(t, err, ErrCorruptProgress)
}

// A checkpoint row whose table OID no table can have (beyond 32 bits) is
// not taken for a table that left the changefeed, whatever its low 32 bits
// say: the target table keeps its rows and the binding stops, as for any
// owner it cannot account for.
func TestACheckpointOfAnImpossibleTableIsNotReclaimed(t *testing.T) {
	e := newSinkEnv(t, nil)
	ctx := context.Background()
	old, recreated := common.DispatcherIDFromUint64(1), common.DispatcherIDFromUint64(2)
	e.firstRow(old)
	e.dur.wait(t, old, 12)
	e.sink.Close()
	// relT's OID, 100, in its low 32 bits.
	_, err := e.conn.Exec(ctx, "UPDATE cdcflow.checkpoints SET table_oid = 4294967396 WHERE dispatcher = $1", hexID(old))
	require.NoError(t, err)

	again := relT
	again.OID = 101
	s2, err := New(Options{DSN: e.pg.DSN, Workers: 2, FlushInterval: 5 * time.Millisecond, MaxFlushInterval: DefaultFlushInterval})
	require.NoError(t, err)
	s2.SetLeft(func(oid uint32) bool { return oid == 100 })
	require.NoError(t, s2.Start(ctx))
	t.Cleanup(s2.Close)
	require.NoError(t, s2.BindAll(ctx, []Binding{{ID: recreated, Rel: again, StartTs: 12}}))
	require.Len(t, s2.Stopped(), 1, "the binding stops")
	require.Contains(t, s2.Stopped()[0], ErrTargetTaken.Error())
	require.Equal(t, []string{`{"id":1,"v":"a","big":null}`}, e.contents("app.t"), "the rows are kept")
}

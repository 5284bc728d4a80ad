package pgsink

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// A write Options.Permit refuses is never sent: once the permit is
// withdrawn (a node's lease could have expired), the row queued after it
// never reaches the target, the sink writes nothing more (its state
// writes refused too) and Err says why.
func TestAWriteNotPermittedIsNeverSent(t *testing.T) {
	var withdrawn atomic.Bool
	lease := errors.New("the node's lease could have expired")
	e := newSinkEnv(t, func(o *Options) {
		o.Permit = func() error {
			if withdrawn.Load() {
				return lease
			}
			return nil
		}
	})
	id := common.DispatcherIDFromUint64(1)
	e.firstRow(id)
	e.dur.wait(t, id, 12)
	require.Equal(t, []string{`{"id":1,"v":"a","big":null}`}, e.contents("app.t"))

	withdrawn.Store(true)
	require.NoError(t, e.sink.ApplyRows(id, rows(14, tx(pgcodec.Insert, col("id", "2"), col("v", "b"), null("big")))))
	require.NoError(t, e.sink.Checkpoint(id, 14))
	testwait.For(t, "the sink stops writing", func() bool { return e.sink.Err() != nil })
	require.ErrorIs(t, e.sink.Err(), ErrNotPermitted)
	require.ErrorIs(t, e.sink.Err(), lease)
	<-e.sink.Superseded()
	require.ErrorIs(t, e.sink.SetState(context.Background(), "k", "v"), ErrNotPermitted)
	require.Equal(t, []string{`{"id":1,"v":"a","big":null}`}, e.contents("app.t"), "nothing sent after the permit was withdrawn")
}

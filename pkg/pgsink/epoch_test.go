package pgsink

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// reports records every checkpoint the sink reports durable, with its
// epoch, in order (the collector's side of the contract, the edge under
// test), and passes it on to the env's durables.
type reports struct {
	mu   sync.Mutex
	got  []durableMark
	next func(common.DispatcherID, uint64, common.Ts)
}

func (r *reports) record(id common.DispatcherID, epoch uint64, ts common.Ts) {
	r.mu.Lock()
	r.got = append(r.got, durableMark{id: id, epoch: epoch, ts: ts})
	r.mu.Unlock()
	r.next(id, epoch, ts)
}

func (r *reports) of(id common.DispatcherID) []durableMark {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []durableMark
	for _, m := range r.got {
		if m.id == id {
			out = append(out, m)
		}
	}
	return out
}

// A BeginEpoch discards what was queued for its dispatcher and not
// committed: the stream sends it again from the checkpoint, and applying
// it would put rows the new epoch may not repeat (or repeats changed)
// into the target, with a checkpoint reported under the new epoch for
// them. The interleaving: the lane's commit of rows at 13 waits for the
// target table, held by the test (seen in pg_locks); meanwhile rows at
// 14 and their checkpoint are queued, then BeginEpoch(2), then a row at
// 16 of the new epoch and its checkpoint; the table is released. The
// rows at 13 (in the commit already) go in under epoch 1; the lane then
// takes the rest at once: the rows at 14 are dropped by the new epoch
// and never applied, no checkpoint at 14 is reported, and the row at 16
// is applied and its checkpoint reported under epoch 2.
func TestBeginEpochDiscardsQueuedUncommittedWork(t *testing.T) {
	e := newSinkEnv(t, func(o *Options) { o.Workers = 1 })
	// Set before any call queues work: the lane reads it after taking
	// that work (under the lane's lock, which orders the two).
	rep := &reports{next: e.dur.record}
	e.sink.SetDurable(rep.record)
	ctx := context.Background()
	id := common.DispatcherIDFromUint64(1)
	e.firstRow(id) // id 1 = "a" at 12, epoch 1
	e.dur.wait(t, id, 12)
	waitWarmedUp(t, e, 1)

	hold := holdTable(t, e, "app.t")
	require.NoError(t, e.sink.ApplyRows(id, rows(13, tx(pgcodec.Insert, col("id", "2"), col("v", "in flight"), null("big")))))
	require.NoError(t, e.sink.Checkpoint(id, 13))
	waitCommitBlockedOn(t, e, "app.t")

	// The lane is in its commit and takes nothing: all of this is queued.
	require.NoError(t, e.sink.ApplyRows(id, rows(14,
		tx(pgcodec.Insert, col("id", "3"), col("v", "discarded"), null("big")),
		tx(pgcodec.Update, col("id", "1"), col("v", "discarded"), null("big")))))
	require.NoError(t, e.sink.Checkpoint(id, 14))
	require.NoError(t, e.sink.BeginEpoch(id, 2, 13))
	require.NoError(t, e.sink.ApplyRows(id, rows(16, tx(pgcodec.Insert, col("id", "4"), col("v", "new epoch"), null("big")))))
	require.NoError(t, e.sink.Checkpoint(id, 16))

	require.NoError(t, hold.Rollback(ctx))
	e.dur.wait(t, id, 16)
	require.Equal(t, []string{
		`{"id":1,"v":"a","big":null}`,
		`{"id":2,"v":"in flight","big":null}`,
		`{"id":4,"v":"new epoch","big":null}`,
	}, e.contents("app.t"), "the rows queued before the new epoch are not applied")
	require.Equal(t, []durableMark{{id: id, epoch: 1, ts: 12}, {id: id, epoch: 1, ts: 13}, {id: id, epoch: 2, ts: 16}},
		rep.of(id), "no checkpoint reported for the discarded work")
	ckpts, err := e.sink.Checkpoints(ctx)
	require.NoError(t, err)
	require.Equal(t, common.Ts(16), ckpts[id])
}

package synthetic

import (
	"context"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/common"
)

// mover moves tables (--move-interval): every interval it removes a random
// dispatcher and adds it again under the same ID from the checkpoint its
// sink confirmed, as when a table moves to another node and back. The new
// registration re-delivers what lies above that checkpoint; messages of the
// old one still queued are ignored by the collector. Choices are seeded by
// the workload's seed.
type mover struct {
	s     *server
	rng   *rand.Rand
	stop  chan struct{}
	done  chan struct{}
	moves atomic.Int64
	// failures counts moves whose removal or re-registration failed (the
	// re-registration is retried until it succeeds or the server stops).
	failures atomic.Int64
}

func newMover(s *server) *mover {
	return &mover{s: s, rng: rand.New(rand.NewPCG(s.meta.Seed, 0x6d6f7665)), stop: make(chan struct{}), done: make(chan struct{})}
}

// run moves one table per interval until stop is closed.
func (m *mover) run(interval time.Duration) {
	defer close(m.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		f := m.s.feeds[m.rng.IntN(len(m.s.feeds))]
		m.move(f, f.ds[m.rng.IntN(len(f.ds))])
	}
}

// move removes d and adds it again from its sink's checkpoint.
func (m *mover) move(f *feed, d dispatcherRef) {
	ctx := context.Background()
	if err := f.coll.RemoveDispatcher(ctx, d.id); err != nil {
		m.failures.Add(1)
		m.s.log.Warn("move: remove failed", zap.Stringer("dispatcher", d.id), zap.Error(err))
		// The collector dropped the dispatcher's state all the same: add
		// it again below.
	}
	start := max(d.startTs, m.checkpoint(f, d.id))
	for {
		err := f.coll.AddDispatcher(ctx, d.id, common.TableSpan(d.table), start)
		if err == nil {
			m.moves.Add(1)
			return
		}
		m.failures.Add(1)
		m.s.log.Warn("move: add failed; retrying", zap.Stringer("dispatcher", d.id), zap.Error(err))
		select {
		case <-m.stop:
			return
		case <-time.After(10 * time.Millisecond): // a retry delay, not synchronisation
		}
	}
}

// checkpoint is what the sink confirmed for id: after RemoveDispatcher
// returned no sink call of it runs, so this is final for the registration.
func (m *mover) checkpoint(f *feed, id common.DispatcherID) common.Ts {
	if f.mem != nil {
		return f.mem.CheckpointOf(id)
	}
	ts, err := f.durable.CheckpointOf(id)
	if err != nil {
		m.s.log.Warn("move: read checkpoint", zap.Stringer("dispatcher", id), zap.Error(err))
		return 0 // from the start-ts: more re-delivery, nothing lost
	}
	return ts
}

// close stops the mover and waits for a move in progress.
func (m *mover) close() {
	close(m.stop)
	<-m.done
}

package replicate

import (
	"context"
	"os"
	"time"

	"go.uber.org/zap"
)

// A clean stop's quiesce, and closing the parts within what ShutdownTimeout has left.

// quiesce ends the stream at its last commit for a clean stop: the sink
// commits every checkpoint at once from now on, and the source waits
// (within timeout) until every table has durably applied the last commit,
// then confirms it to the slot, so that the next start reads nothing
// again, and says whether it did. If it cannot (the target is down), the
// slot keeps the position it had, as after a crash. A stopped table that
// still holds the slot (not released) holds its confirmed position below
// the last commit for good, so the stop does not wait for it (it did for
// the whole timeout, then warned): it says so and keeps the position.
func (p *parts) quiesce(timeout time.Duration) bool {
	p.sink.Drain()
	var holding []string
	for _, t := range p.sink.StoppedTables() {
		if !t.Released {
			holding = append(holding, t.Table)
		}
	}
	if len(holding) > 0 {
		p.log.Warn("stopping at the slot's position: stopped tables hold it below the last commit until they are resumed "+
			"or released (--max-retained-wal); the next start reads the stream again from there", zap.Strings("stopped", holding))
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	quiesce := p.source.Quiesce
	if p.knobs != nil && p.knobs.quiesce != nil {
		quiesce = p.knobs.quiesce
	}
	if err := quiesce(ctx); err != nil {
		p.log.Warn("stopping without confirming the last commit to the slot: the next start reads the stream again from where it was last confirmed",
			zap.Error(err))
		return false
	}
	p.log.Info("the last commit is applied everywhere and confirmed to the slot")
	return true
}

// recordAtStop records, once a clean stop's quiesce had every table
// durably apply the last commit, what serve records on its ticks and a
// next start would otherwise redo: the initial snapshot as done (snapshot:
// not recorded yet), then the copies applied since the copier last
// settled its list. Both within a quarter of ShutdownTimeout (or what the
// stop has left).
func (p *parts) recordAtStop(cfg Config, snapshot bool) {
	ctx, cancel := context.WithTimeout(context.Background(), min(cfg.ShutdownTimeout/4, time.Until(p.stopBy)))
	defer cancel()
	if snapshot {
		p.recordSnapshotAtStop(ctx, cfg)
	}
	p.copier.settleAtStop(ctx)
}

// closeBudget is how long close may take: what a clean stop has left of
// ShutdownTimeout (it began with the quiesce), or all of it when serve
// ends otherwise (an error, or a failed start).
func (p *parts) closeBudget(shutdown time.Duration) time.Duration {
	if p.stopBy.IsZero() {
		return shutdown
	}
	return max(0, time.Until(p.stopBy))
}

// close stops everything in reverse order, within timeout.
func (p *parts) close(timeout time.Duration) {
	p.cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if k := p.knobs; k != nil && k.closing != nil {
			k.closing() // first, so that a test can hold the close past its budget
		}
		if k := p.knobs; k != nil && k.closed != nil {
			defer k.closed()
		}
		if p.coll != nil {
			if err := p.coll.Close(); err != nil {
				p.log.Warn("close collector", zap.Error(err))
			}
		}
		if p.svc != nil {
			p.svc.Close()
		}
		if p.source != nil {
			p.source.Close()
		}
		if p.store != nil {
			_ = p.store.Close()
		}
		p.wg.Wait()
		if p.inproc != nil {
			p.inproc.Close()
		}
		if p.sink != nil {
			p.sink.Close()
		}
		if p.positions != nil {
			p.positions.Close()
		}
		p.closedAll.Store(true)

	}()
	select {
	case <-done:
	case <-time.After(timeout):
		p.log.Error("shutdown timed out: closing did not end within what the stop had left of --shutdown-timeout", zap.Duration("left", timeout))
	}
}

// closeDataDir removes a temporary data directory and releases the
// directory's lock, after close: not while a store close cut off by its
// budget may still write there (the next start removes it then).
func (p *parts) closeDataDir() {
	if p.tmpDir && (p.store == nil || p.closedAll.Load()) {
		_ = os.RemoveAll(p.dataDir)
	}
	p.dirLock.release()
}

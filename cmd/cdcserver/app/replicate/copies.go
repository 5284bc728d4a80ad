package replicate

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/backoff"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
	"github.com/cdcflow/eventservice/pkg/pgsource"
)

// copier copies the rows of tables that joined the changefeed after its
// snapshot (pgsource.Source.CopyTable), one table at a time, and keeps
// the tables whose copy is not yet durably applied in the target's
// cdcflow.state (copiesKey): a table is listed there before it is bound
// (so before its dispatcher can write a checkpoint, which would make a
// start take it for copied) and taken off once its dispatcher's durable
// checkpoint has passed the copy's last chunk (settle: every settleEvery,
// and once more at a clean stop). A start copies the listed tables again (a copy
// cut short by a crash left rows out; copying again is harmless, the sink
// upserts) and the published tables without a checkpoint (they joined
// while serve was down).
type copier struct {
	p   *parts
	key string
	log *zap.Logger
	// settleEvery is how often run settles the list.
	settleEvery time.Duration
	// done is closed when run returns: finishing is then settleAtStop's.
	done chan struct{}

	mu    sync.Mutex
	queue []copyJob
	wake  chan struct{}
	// current is the table being copied ("" between copies) and from the
	// source's CopiedRows when it began.
	current string
	from    int64

	// listMu serialises the list's changes (listed as the target's
	// state holds it).
	listMu sync.Mutex
	listed []uint32
	fresh  map[uint32]bool // listed tables copied anew (emptied first): they rejoined

	// Owned by run, then by settleAtStop once run returned.
	finishing map[uint32]finished // copied up to ts, listed until durable there
}

func copiesKey(slot string) string { return "copies:" + slot }

// newCopier is the copier of slot's changefeed, settling its list every
// settleEvery (0: a second).
func newCopier(p *parts, slot string, settleEvery time.Duration) *copier {
	if settleEvery == 0 {
		settleEvery = time.Second
	}
	return &copier{p: p, key: copiesKey(slot), log: p.log.Named("copy"), settleEvery: settleEvery, done: make(chan struct{}),
		wake: make(chan struct{}, 1), finishing: map[uint32]finished{}, fresh: map[uint32]bool{}}
}

// finished is a copy that ended at ts (fresh: one that emptied the table
// first), listed until the target holds it durably.
type finished struct {
	ts    common.Ts
	fresh bool
}

// copyJob is a queued copy: fresh empties the table first.
type copyJob struct {
	rel   pgcodec.Relation
	fresh bool
}

// pending returns the tables the target lists as not copied yet, each
// with whether its copy empties it first (listed as "oid!").
func (c *copier) pending(ctx context.Context) (map[uint32]bool, error) {
	v, _, err := c.p.sink.State(ctx, c.key)
	if err != nil {
		return nil, err
	}
	c.listMu.Lock()
	defer c.listMu.Unlock()
	out := parseCopies(v)
	for oid, fresh := range out {
		c.listed = append(c.listed, oid)
		if fresh {
			c.fresh[oid] = true
		}
	}
	slices.Sort(c.listed)
	return out, nil
}

// parseCopies reads the list of copies owed as the target's state holds
// it ("oid" or "oid!" for a fresh one, comma-separated), skipping what is
// not an OID: the state is the target's, and hostile until read.
func parseCopies(v string) map[uint32]bool {
	out := map[uint32]bool{}
	for _, f := range strings.Split(v, ",") {
		fresh := strings.HasSuffix(f, "!")
		if oid, err := strconv.ParseUint(strings.TrimSuffix(f, "!"), 10, 32); err == nil && oid != 0 {
			out[uint32(oid)] = out[uint32(oid)] || fresh
		}
	}
	return out
}

// list lists oids as owing a copy (fresh: one that empties them first),
// durably, before they are bound.
func (c *copier) list(ctx context.Context, fresh bool, oids ...uint32) error {
	c.listMu.Lock()
	defer c.listMu.Unlock()
	listed, changed := slices.Clone(c.listed), false
	for _, oid := range oids {
		if !slices.Contains(listed, oid) {
			listed, changed = append(listed, oid), true
		}
		if fresh && !c.fresh[oid] {
			changed = true
		}
	}
	if !changed {
		return nil
	}
	if err := c.saveLocked(ctx, listed, fresh, oids); err != nil {
		return err
	}
	return nil
}

// unlist takes oids off the list.
func (c *copier) unlist(ctx context.Context, oids ...uint32) error {
	c.listMu.Lock()
	defer c.listMu.Unlock()
	return c.unlistLocked(ctx, oids...)
}

// unlistLocked is unlist with listMu held.
func (c *copier) unlistLocked(ctx context.Context, oids ...uint32) error {
	listed := slices.DeleteFunc(slices.Clone(c.listed), func(o uint32) bool { return slices.Contains(oids, o) })
	if len(listed) == len(c.listed) {
		return nil
	}
	return c.saveLocked(ctx, listed, false, nil)
}

// add queues a listed table for its copy (fresh: emptied first).
func (c *copier) add(rel pgcodec.Relation, fresh bool) {
	c.mu.Lock()
	c.queue = append(c.queue, copyJob{rel: rel, fresh: fresh})
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// run copies the queued tables until ctx ends, and settles the list every
// settleEvery (after a copy, if one fell due during it). A copy that fails (the
// source down, a privilege missing) goes to the end of the queue and is
// tried again after a back-off of its own, the others meanwhile.
func (c *copier) run(ctx context.Context) {
	defer close(c.done)
	tick := time.NewTicker(time.Second) // the failed copies' retries
	defer tick.Stop()
	settle := time.NewTicker(c.settleEvery)
	defer settle.Stop()
	failures := map[uint32]int{}
	retryAt := map[uint32]time.Time{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
		case <-tick.C:
		case <-settle.C:
			c.settle(ctx)
		}
		c.mu.Lock()
		todo := c.queue
		c.queue = nil
		c.mu.Unlock()
		var later []copyJob
		for _, job := range todo {
			rel := job.rel
			if time.Now().Before(retryAt[rel.OID]) {
				later = append(later, job)
				continue
			}
			if err := c.copyTable(ctx, job); err != nil {
				if ctx.Err() != nil {
					return
				}
				failures[rel.OID]++
				// 2s doubling up to a minute, no jitter (one copier, one
				// table at a time).
				wait := backoff.Delay(failures[rel.OID], 2*time.Second, time.Minute, 0, 0)
				retryAt[rel.OID] = time.Now().Add(wait)
				c.log.Error("copy a table that joined: trying again later", zap.String("table", rel.QualifiedName()),
					zap.Duration("in", wait), zap.Error(err))
				later = append(later, job)
				continue
			}
			delete(failures, rel.OID)
			delete(retryAt, rel.OID)
			select {
			case <-settle.C: // due during the copy: a long run of copies settles as it goes
				c.settle(ctx)
			default:
			}
		}
		if len(later) > 0 {
			c.mu.Lock()
			c.queue = append(c.queue, later...)
			c.mu.Unlock()
		}
	}
}

// copyTable copies rel and remembers where its copy ends.
func (c *copier) copyTable(ctx context.Context, job copyJob) error {
	rel := job.rel
	if err := c.list(ctx, job.fresh, rel.OID); err != nil { // listed when it joined; again, in case
		return err
	}
	c.log.Info("copying the rows of a table that joined", zap.String("table", rel.QualifiedName()))
	began := time.Now()
	c.mu.Lock()
	c.current, c.from = rel.QualifiedName(), c.p.source.CopiedRows()
	c.mu.Unlock()
	res, err := c.p.source.CopyTable(ctx, rel.OID, job.fresh)
	c.mu.Lock()
	c.current = ""
	c.mu.Unlock()
	switch {
	case errors.Is(err, pgsource.ErrTableGone) || errors.Is(err, pgsource.ErrUnreplicable):
		c.log.Warn("a table that joined is not copied", zap.String("table", rel.QualifiedName()), zap.Error(err))
		return c.unlist(ctx, rel.OID)
	case errors.Is(err, pgsource.ErrKeylessTooLarge):
		// Read again and again it would load the source for nothing: it
		// stays listed (status: copy owed), and a start tries again.
		c.log.Error("a table without a key that joined is too large to copy while streaming: add a primary key "+
			"(it is then copied by key); it stays owed a copy", zap.String("table", rel.QualifiedName()), zap.Error(err))
		return nil
	case err != nil:
		return err
	}
	c.finishing[rel.OID] = finished{ts: res.Ts, fresh: job.fresh}
	c.log.Info("copied the rows of a table that joined", zap.String("table", rel.QualifiedName()), zap.Int64("rows", res.Rows),
		zap.Int("chunks", res.Chunks), zap.Int("read_again", res.Retries), zap.Duration("took", time.Since(began)),
		zap.Stringer("ts", res.Ts))
	return nil
}

// status is the progress line's part: the table being copied, its rows
// so far and the tables queued ("" when none).
func (c *copier) status() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.current == "" && len(c.queue) == 0 {
		return ""
	}
	if c.current == "" {
		return fmt.Sprintf("  copies: %d tables queued", len(c.queue))
	}
	return fmt.Sprintf("  copying %s: %d rows, %d more tables queued", c.current, c.p.source.CopiedRows()-c.from, len(c.queue))
}

// settle takes off the list the tables whose copy the target holds.
func (c *copier) settle(ctx context.Context) {
	var done []uint32
	c.listMu.Lock()
	for oid, f := range c.finishing {
		if c.fresh[oid] && !f.fresh {
			// Listed again to be copied anew (it rejoined) since this copy
			// ended: that copy's listing is not this one's to take off.
			delete(c.finishing, oid)
			continue
		}
		if c.p.sink.Durable(dispatcherOf(oid)) >= f.ts {
			done = append(done, oid)
		}
	}
	if len(done) == 0 {
		c.listMu.Unlock()
		return
	}
	err := c.unlistLocked(ctx, done...)
	c.listMu.Unlock()
	if err != nil {
		c.log.Warn("record copies done", zap.Error(err))
		return
	}
	for _, oid := range done {
		delete(c.finishing, oid)
	}
}

// settleAtStop settles the list once more at a clean stop, after its
// quiesce had every table durably apply the last commit: a copy applied
// since the last settle would otherwise stay listed, and the next start
// would copy its table again. It waits (within ctx) for run to return
// (serve's context ended with the stop), so that no copy ends while it
// settles.
func (c *copier) settleAtStop(ctx context.Context) {
	select {
	case <-c.done:
	case <-ctx.Done():
		c.log.Warn("stopping without taking the copies applied off the list: the next start copies their tables again", zap.Error(ctx.Err()))
		return
	}
	c.settle(ctx)
}

// saveLocked records the tables whose copy is not yet durable (listMu
// held).
func (c *copier) saveLocked(ctx context.Context, listed []uint32, fresh bool, oids []uint32) error {
	freshNow := maps.Clone(c.fresh)
	maps.DeleteFunc(freshNow, func(oid uint32, _ bool) bool { return !slices.Contains(listed, oid) })
	if fresh {
		for _, oid := range oids {
			freshNow[oid] = true
		}
	}
	f := make([]string, len(listed))
	for i, oid := range listed {
		f[i] = strconv.FormatUint(uint64(oid), 10)
		if freshNow[oid] {
			f[i] += "!"
		}
	}
	if err := c.p.sink.SetState(ctx, c.key, strings.Join(f, ",")); err != nil {
		return err
	}
	c.listed, c.fresh = listed, freshNow
	return nil
}

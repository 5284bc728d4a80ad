package replicate

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// Tables that join (or join again) the publication while serve runs.

// add binds a table to the sink and registers its dispatcher from start.
func (p *parts) add(ctx context.Context, rel pgcodec.Relation, start common.Ts) error {
	id := dispatcherOf(rel.OID)
	if err := p.sink.Bind(ctx, id, rel, start); err != nil {
		return err
	}
	return p.coll.AddDispatcher(ctx, id, common.TableSpan(int64(rel.OID)), start)
}

// addNewTables registers the tables the source finds while streaming.
func (p *parts) addNewTables(ctx context.Context) {
	// A table that could not be listed or bound (the target down) is
	// tried again: it is announced once, and the slot is held before it
	// until it is subscribed.
	var retry []newTable
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		var todo []newTable
		select {
		case <-ctx.Done():
			return
		case t := <-p.newTables:
			todo = []newTable{t}
		case <-tick.C:
			todo, retry = retry, nil
		}
		for _, t := range todo {
			if t.rejoin && p.known[t.rel.OID] {
				// Its changes while it was out of the publication are lost:
				// copied anew, emptied first.
				if err := p.rejoinTable(ctx, t.rel); err != nil {
					if ctx.Err() != nil {
						return
					}
					p.log.Error("copy a table that joined again: trying again in a second", zap.String("table", t.rel.QualifiedName()), zap.Error(err))
					retry = append(retry, t)
					continue
				}
				continue
			}
			if p.known[t.rel.OID] {
				continue // announced again (a restarted stream, or the poll and the stream both)
			}
			if err := p.addNewTable(ctx, t); err != nil {
				if ctx.Err() != nil {
					return
				}
				p.log.Error("add a new table: trying again in a second", zap.String("table", t.rel.QualifiedName()), zap.Error(err))
				retry = append(retry, t)
			}
		}
	}
}

// rejoinTable lists a bound table that joined the publication again for a
// fresh copy, records its new membership row (after the listing: see
// members) and queues the copy.
func (p *parts) rejoinTable(ctx context.Context, rel pgcodec.Relation) error {
	if err := p.copier.list(ctx, true, rel.OID); err != nil {
		return err
	}
	if err := p.recordMembership(ctx, rel.OID); err != nil {
		return err
	}
	p.copier.add(rel, true)
	return nil
}

// recordMembership records oid's current membership row.
func (p *parts) recordMembership(ctx context.Context, oid uint32) error {
	current, err := p.source.Memberships(ctx)
	if err != nil {
		return err
	}
	return p.members.recordOne(ctx, oid, current)
}

// addNewTable lists, binds, registers and queues the copy of a table that
// joined.
func (p *parts) addNewTable(ctx context.Context, t newTable) error {
	// A table the changefeed wrote before that joins now (it left the
	// publication before this start): its target rows may hold rows
	// deleted while it was out, so it is copied anew, emptied first.
	_, fresh := p.ckpts[dispatcherOf(t.rel.OID)]
	// Listed before it is bound: once bound, its checkpoint could make a
	// start take it for copied.
	if err := p.copier.list(ctx, fresh, t.rel.OID); err != nil {
		return err
	}
	if err := p.recordMembership(ctx, t.rel.OID); err != nil { // listed first: see members
		return err
	}
	if err := p.add(ctx, t.rel, t.firstTs-1); err != nil {
		return err
	}
	p.known[t.rel.OID] = true
	p.log.Info("replicating a new table", zap.String("table", t.rel.QualifiedName()), zap.Stringer("from", t.firstTs))
	p.copier.add(t.rel, fresh) // the rows it had when it joined
	return nil
}

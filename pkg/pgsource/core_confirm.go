package pgsource

import (
	"fmt"

	"github.com/cdcflow/eventservice/pkg/common"
)

// The WAL core's positions (see core.go): how far the subscriptions may be
// resolved, where the slot may be confirmed, and where a session starts.
// Invariants: a subscription is never resolved past the open
// transaction; nextConfirm never passes the safe point, a hold, or the last
// commit at or below them; reseedFrom continues the chain from the
// position saved where another process confirmed the slot, never from
// behind it, or fails (ErrUnknownSlot, ErrSlotTakenOver).

// resolveTarget is the ts every subscription may be resolved to: the last
// commit, below the open transaction and its DDL.
func (c *core) resolveTarget() common.Ts {
	ts := c.last
	if c.cur != nil {
		ts = min(ts, c.cur.ts-2)
	}
	return ts
}

// resolve moves the schema frontier and the subscriptions among all that
// are behind ts to ts (a tick, or a quiesce).
func (c *core) resolve(ts common.Ts, all []*sub) {
	c.emit(action{kind: actFrontier, ts: ts})
	var behind []*sub
	for _, b := range all {
		if !c.see(b) || ts <= b.resolved || ts <= b.startTs || (b.partial != 0 && b.partial <= ts) {
			continue
		}
		behind = append(behind, b)
	}
	if len(behind) > 0 {
		c.emit(action{kind: actResolve, ts: ts, subs: behind})
	}
}

// resolvedPushed records that b's resolved-ts was pushed to ts.
func (c *core) resolvedPushed(b *sub, ts common.Ts) {
	if ts > b.resolved {
		b.resolved = ts
	}
}

// confirmed records that the slot was confirmed to pos: the journal keeps
// its entries from the last at or below pos.
func (c *core) confirmed(pos Position) {
	i := 0
	for i < len(c.journal)-1 && c.journal[i+1].LSN <= pos.LSN {
		i++
	}
	c.journal = append(c.journal[:0], c.journal[i:]...)
}

// nextConfirm is where the slot may be confirmed: from saved, the latest
// journal entry at or below the safe point (lowered below every hold: a new
// table's first change not yet subscribed), or, once nothing decoded waits
// to be durable, the server's WAL end (walEnd, whose ts is the last commit
// before it). Never past the safe point; saved when it is unknown.
//
// Why the WAL end may be confirmed: a walsender asked to shut down waits
// until its client confirms exactly that (after the last commit come
// aborted transactions, the shutdown checkpoint), and the server's shutdown
// with it. It cannot lose a row: a transaction is skipped on restart only
// if its commit record lies before the confirmed position, and every
// commit before walEnd was decoded (the stream is in order) and is durable
// (its ts is at or below the safe point); walEnd.Ts, the last of them,
// seeds the chain as a commit's position would.
func nextConfirm(saved Position, journal []Position, walEnd Position, safe common.Ts, known bool, holds []common.Ts) Position {
	if !known {
		return saved
	}
	for _, hold := range holds {
		if hold-1 < safe {
			safe = hold - 1
		}
	}
	next := saved
	for _, p := range journal {
		if p.Ts <= safe && p.LSN > next.LSN {
			next = p
		}
	}
	if walEnd.LSN > next.LSN && walEnd.Ts <= safe {
		next = walEnd
	}
	return next
}

// reseedFrom is where a session's commit-ts chain continues: from, unless
// the slot's confirmed flush LSN (final once the session streams: a slot
// serves one walsender) is past it. Then another process of the changefeed
// confirmed more (one that re-attached between a take-over's Open and this
// start), and the server streams from there whatever was asked: the chain
// must continue from the position that process saved there before it
// confirmed (saved, if found), or a commit after it could get a commit-ts
// at or below one that process delivered, and be skipped. Without it the
// chain cannot continue (ErrProtocol, ErrUnknownSlot). A subscription below
// it would miss the commits up to it, gone from the slot: the other
// process confirmed only what its tables had durably applied, so a new
// process subscribing from their checkpoints is never below it, and an
// earlier one that is has been superseded (ErrSlotTakenOver).
func reseedFrom(from Position, confirmed uint64, saved Position, found bool, subs []*sub) (Position, error) {
	if confirmed <= from.LSN {
		return from, nil
	}
	if !found {
		return from, fmt.Errorf("%w: %w: the slot's confirmed flush LSN %d moved past this source's %d, and no position was saved for it",
			ErrProtocol, ErrUnknownSlot, confirmed, from.LSN)
	}
	for _, b := range subs {
		if b.have < saved.Ts {
			return from, fmt.Errorf("%w: table %d has %v, but it confirmed the slot to %d at %v",
				ErrSlotTakenOver, b.oid, b.have, confirmed, saved.Ts)
		}
	}
	return saved, nil
}

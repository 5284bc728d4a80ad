package pgsource

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// The copy of a table without a key (pgcodec.Relation.Identity). The
// keyed copy (copy.go) drops a chunk's rows whose keys a change in its
// window touched; without a key nothing tells which rows a change
// touched, and an insert is not idempotent. So a keyless table is copied
// in one chunk, by what its snapshot saw rather than by key:
//
//  1. at the low watermark the stream empties the table's subscriptions
//     (a truncate), and from there holds the table's changes instead of
//     pushing them;
//  2. the chunk reads the whole table in a snapshot taken after that
//     watermark (pg_current_snapshot: xmin, xmax, in progress);
//  3. at the high watermark the stream pushes the chunk's rows, then the
//     held changes of the transactions the snapshot did not see (in
//     progress, or begun after it), in their order. Those it saw are in
//     the chunk; every transaction decoded before the low watermark is
//     too (committed before the snapshot; the gap copy.go describes is
//     checked the same way), and its rows the truncate took away.
//
// So the target holds the table as of the snapshot, then every later
// transaction once, in commit order: an update or delete by the whole old
// row finds the row the chunk wrote. A chunk sent back drops what it held
// (the next attempt's truncate and snapshot cover it). Memory: the table's
// values (Options.KeylessCopyBytes, else ErrKeylessTooLarge) and the
// changes of the one window.

// snapshotSees is a chunk snapshot's visibility, as 32-bit xids (what
// the stream's BEGIN carries): xmin, xmax and the transactions in
// progress.
type snapshotSees struct {
	xmin, xmax uint32
	xip        []uint32
}

// parseSnapshot reads pg_current_snapshot's text form (xmin:xmax:xip,...).
func parseSnapshot(snap string) (snapshotSees, error) {
	var v snapshotSees
	parts := strings.SplitN(snap, ":", 3)
	if len(parts) != 3 {
		return v, fmt.Errorf("%w: snapshot %q", ErrProtocol, snap)
	}
	for i, p := range parts[:2] {
		x, err := strconv.ParseUint(p, 10, 64)
		if err != nil {
			return v, fmt.Errorf("%w: snapshot %q", ErrProtocol, snap)
		}
		if i == 0 {
			v.xmin = uint32(x)
		} else {
			v.xmax = uint32(x)
		}
	}
	if parts[2] == "" {
		return v, nil
	}
	for _, p := range strings.Split(parts[2], ",") {
		x, err := strconv.ParseUint(p, 10, 64)
		if err != nil {
			return v, fmt.Errorf("%w: snapshot %q", ErrProtocol, snap)
		}
		v.xip = append(v.xip, uint32(x))
	}
	return v, nil
}

// visible reports whether the snapshot sees committed transaction xid
// (PostgreSQL's XidInMVCCSnapshot, modulo 2^32 as TransactionIdPrecedes).
func (v snapshotSees) visible(xid uint32) bool {
	switch {
	case int32(xid-v.xmax) >= 0:
		return false // began after the snapshot
	case int32(xid-v.xmin) < 0:
		return true
	}
	return !slices.Contains(v.xip, xid)
}

// heldChange is a change of a keyless table held in a chunk's window: its
// transaction's xid and the row's store op and value.
type heldChange struct {
	xid   uint32
	op    common.OpType
	value []byte
}

// tableKeyless reports whether table oid, as the publication publishes
// it, has no key (a chunk's keyless is fixed before its low watermark).
func (s *Source) tableKeyless(ctx context.Context, conn *pgx.Conn, oid uint32) (bool, error) {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return false, err
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // read only
	rel := pgcodec.Relation{OID: oid}
	var ident string
	err = tx.QueryRow(ctx, `SELECT n.nspname, c.relname, c.relreplident FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1`, oid).Scan(&rel.Schema, &rel.Name, &ident)
	if errors.Is(err, pgx.ErrNoRows) {
		return false, fmt.Errorf("%w: table %d", ErrTableGone, oid)
	} else if err != nil {
		return false, err
	}
	if len(ident) != 1 {
		return false, fmt.Errorf("%w: table %d has replica identity %q", ErrProtocol, oid, ident)
	}
	if rel.Columns, err = tableColumns(ctx, tx.Conn(), oid, ident[0]); err != nil {
		return false, err
	}
	pub, err := publishedShape(ctx, tx, s.pubs, rel)
	if err != nil {
		return false, err
	}
	return identityOf(pub.columns(rel.Columns), ident[0]) != "", nil
}

// keylessQuery selects every row of a keyless table the publication
// publishes.
func keylessQuery(rel pgcodec.Relation, scope readScope) string {
	q := "SELECT " + selectList(rel) + " FROM " + scope.from
	if scope.filter != "" {
		q += " WHERE " + scope.filter
	}
	return q
}

// keylessWindow returns the keyless chunk whose window is open on table
// oid, or nil.
func (c *core) keylessWindow(oid uint32) *copyChunk {
	for _, w := range c.st.copyWindows[oid] {
		if w.keyless {
			return w
		}
	}
	return nil
}

// hold keeps a change of a keyless table in its chunk's window (see
// above); value is the change's own encoding.
func (c *core) hold(w *copyChunk, op common.OpType, value []byte) {
	w.held = append(w.held, heldChange{xid: c.cur.xid, op: op, value: value})
}

// pushKeylessChunk adds a keyless chunk's rows to the transaction as
// inserts, then the changes it held that its snapshot did not see.
func (c *core) pushKeylessChunk(ch *copyChunk) {
	oid := ch.st.oid
	for _, r := range ch.rows {
		c.add(oid, pgcodec.Insert, nil, pgcodec.RowChange{Change: pgcodec.Insert, Columns: r.datums})
		c.tally.copyRows++
		ch.pushed++
	}
	for _, h := range ch.held {
		if !ch.sees.visible(h.xid) {
			c.addRow(oid, h.op, nil, h.value)
		}
	}
	ch.held = nil
}

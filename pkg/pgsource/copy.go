package pgsource

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// The copy of a table that joins while streaming (CopyTable): its rows
// are read in chunks by key, each between two watermarks the stream
// itself carries, and pushed into the stream at the second one's commit
// (DBLog's watermarks):
//
//  1. a low watermark, a transactional logical message, is committed;
//  2. a chunk is read in a REPEATABLE READ transaction begun after it;
//  3. a high watermark is committed.
//
// The stream notes the keys every change of the table touches between the
// two (the window). At the high watermark it drops the chunk's rows whose
// keys were touched and adds the others to that transaction as inserts
// (upserts, for the sink): a row the chunk read is the row as of its
// snapshot, and a change after the snapshot that commits before the high
// watermark touched its key, so what is pushed is never older than what
// the stream already delivered, and what commits after the high watermark
// applies on top. The writers of the table are never blocked.
//
// The one gap: a transaction whose commit is in the WAL before the low
// watermark (so outside the window) but not yet visible to the chunk's
// snapshot (committed, still waiting for a synchronous standby). The
// chunk's transaction finds such commits among its snapshot's in-progress
// transactions (pg_xact_status 'committed') and reads the chunk again
// later, under new watermarks (errSnapshotAhead).
//
// A truncate or a new relation version of the table in the window, or a
// table without a subscription at the high watermark, sends the chunk
// back to be read again too. Memory: one chunk per copy (CopyChunkRows
// rows, at most copyChunkBytes of values).

// copyPrefix marks the watermarks of a copy (pg_logical_emit_message).
const copyPrefix = "cdcflow-copy"

// copyChunkBytes bounds the values one chunk holds.
const copyChunkBytes = 16 << 20

// errSnapshotAhead: the chunk's snapshot misses a commit the stream may
// have passed before the low watermark; the chunk is read again.
var errSnapshotAhead = errors.New("pgsource: a commit before the low watermark is not yet visible")

// copyChunk is one chunk of a copy, from its registration to its push.
type copyChunk struct {
	id   string
	oid  uint32
	done chan struct{} // closed once pushed (ts) or sent back (retry)

	// Set by the copier under Source.mu before the high watermark is
	// written, read by the stream under it after that watermark decoded.
	ready bool
	rel   pgcodec.Relation
	rows  []copiedRow
	xip   []uint32 // the chunk snapshot's in-progress transactions (their xids' low 32 bits)

	// Owned by the stream goroutine from the low watermark on.
	window    map[string]struct{}
	lowN      uint64 // the commits the stream had decoded at the low watermark
	truncated bool   // a truncate in the window
	relNew    bool   // a new relation version in the window
	relFirst  bool   // the stream's first description of the table in the window
	abandoned bool   // dropped from the registry: forget the window

	// Set by the stream before done is closed.
	ts     common.Ts
	retry  bool
	pushed int // rows pushed (the others were touched in the window)
}

// copiedRow is a row a chunk read: its key's text and its columns.
type copiedRow struct {
	key    [][]byte
	datums []pgcodec.Datum
}

// CopyResult is what CopyTable copied.
type CopyResult struct {
	// Ts is the commit-ts of the last chunk's high watermark: a
	// subscription that has it has every row the table held when the
	// copy began, or a later version of it.
	Ts common.Ts
	// Rows pushed (a row the stream changed during its chunk's window is
	// not: the stream delivered its newer version).
	Rows int64
	// Chunks read, and Retries: chunks read again.
	Chunks, Retries int
}

// CopyTable copies the rows table oid holds into the stream, in chunks
// between watermarks (see above), and returns once the stream has pushed
// the last one. The table must have a subscription from below the
// current stream position (a chunk whose table has none is read again
// until it has). One copy per table at a time. A table that is gone is
// ErrTableGone; a table without a key ErrNoKey.
func (s *Source) CopyTable(ctx context.Context, oid uint32) (CopyResult, error) {
	var res CopyResult
	conn, err := connectCopy(ctx, s.opts.DSN)
	if err != nil {
		return res, err
	}
	defer conn.Close(context.Background())
	var after [][]byte
	backoff := newCopyBackoff(s)
	for {
		c, last, err := s.copyChunk(ctx, conn, oid, after)
		switch {
		case errors.Is(err, errSnapshotAhead) || err == nil && c.retry:
			res.Retries++
			s.met.copyRetries.Inc()
			if err := backoff.wait(ctx); err != nil {
				return res, err
			}
			continue
		case err != nil:
			return res, err
		}
		backoff.reset()
		res.Chunks++
		res.Ts = c.ts
		res.Rows += int64(c.pushed)
		if last == nil {
			return res, nil
		}
		after = last
	}
}

// connectCopy is a connection for a copy: its watermarks carry no data,
// so their commits do not wait for a synchronous standby.
func connectCopy(ctx context.Context, dsn string) (*pgx.Conn, error) {
	conn, err := connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "SET synchronous_commit = local"); err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	return conn, nil
}

// copyBackoff spaces the reads of a chunk sent back.
type copyBackoff struct {
	s     *Source
	delay time.Duration
}

func newCopyBackoff(s *Source) *copyBackoff { return &copyBackoff{s: s, delay: 20 * time.Millisecond} }

func (b *copyBackoff) reset() { b.delay = 20 * time.Millisecond }

func (b *copyBackoff) wait(ctx context.Context) error {
	t := b.s.opts.Clock.NewTimer(b.delay)
	defer t.Stop()
	b.delay = min(2*b.delay, 2*time.Second)
	select {
	case <-t.C():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-b.s.ctx.Done():
		return ErrClosed
	}
}

// copyChunk reads and pushes one chunk from after the key after (nil:
// from the first). last is the key to continue after, nil if the chunk
// was the table's end.
func (s *Source) copyChunk(ctx context.Context, conn *pgx.Conn, oid uint32, after [][]byte) (c *copyChunk, last [][]byte, err error) {
	c = &copyChunk{id: fmt.Sprintf("%s.%d", s.copyNonce, s.copySeq.Add(1)), oid: oid, done: make(chan struct{})}
	s.mu.Lock()
	if s.mu.closed {
		s.mu.Unlock()
		return nil, nil, ErrClosed
	}
	s.mu.copies[c.id] = c
	s.mu.Unlock()
	pushed, chunk := false, c
	defer func() {
		if !pushed {
			s.dropCopy(chunk)
		}
	}()
	if err := emitCopyMark(ctx, conn, "low", c.id); err != nil {
		return nil, nil, err
	}
	rel, rows, last, xip, err := s.readChunk(ctx, conn, oid, after)
	if err != nil {
		return nil, nil, err
	}
	s.mu.Lock()
	c.rel, c.rows, c.xip, c.ready = rel, rows, xip, true
	s.mu.Unlock()
	if h := s.opts.copyHook; h != nil {
		h(oid, len(rows))
	}
	if err := emitCopyMark(ctx, conn, "high", c.id); err != nil {
		return nil, nil, err
	}
	select {
	case <-c.done:
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	case <-s.ctx.Done():
		return nil, nil, ErrClosed
	}
	pushed = true
	return c, last, nil
}

// emitCopyMark commits a watermark.
func emitCopyMark(ctx context.Context, conn *pgx.Conn, kind, id string) error {
	if _, err := conn.Exec(ctx, "SELECT pg_logical_emit_message(true, $1, $2)", copyPrefix, kind+":"+id); err != nil {
		return fmt.Errorf("pgsource: copy watermark: %w", err)
	}
	return nil
}

// readChunk reads up to CopyChunkRows rows of oid after the key after, in
// key order, in a snapshot taken after the low watermark, with the
// relation as that snapshot sees it.
func (s *Source) readChunk(ctx context.Context, conn *pgx.Conn, oid uint32, after [][]byte) (rel pgcodec.Relation, rows []copiedRow, last [][]byte, xip []uint32, err error) {
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return rel, nil, nil, nil, err
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // read only
	var snap string
	if err := tx.QueryRow(ctx, "SELECT pg_current_snapshot()::text").Scan(&snap); err != nil {
		return rel, nil, nil, nil, err
	}
	xip = snapshotInProgress(snap)
	if len(xip) > 0 && !s.opts.skipSyncRepCheck {
		var waiting int
		if err := tx.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND backend_xid::text = ANY($1)",
			xidTexts(xip)).Scan(&waiting); err != nil {
			return rel, nil, nil, nil, err
		}
		if waiting > 0 {
			return rel, nil, nil, nil, errSnapshotAhead
		}
	}
	var ident string
	err = tx.QueryRow(ctx, `SELECT n.nspname, c.relname, c.relreplident FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1`, oid).Scan(&rel.Schema, &rel.Name, &ident)
	if errors.Is(err, pgx.ErrNoRows) {
		return rel, nil, nil, nil, fmt.Errorf("%w: table %d", ErrTableGone, oid)
	} else if err != nil {
		return rel, nil, nil, nil, err
	}
	rel.OID = oid
	if rel.Columns, err = tableColumns(ctx, tx.Conn(), oid, ident[0]); err != nil {
		return rel, nil, nil, nil, err
	}
	if err := rel.Validate(); err != nil {
		return rel, nil, nil, nil, fmt.Errorf("%w: %s: %w", ErrNoKey, rel.QualifiedName(), err)
	}
	query, args := chunkQuery(rel, after, s.opts.CopyChunkRows)
	res, err := tx.Query(ctx, query, args...)
	if err != nil {
		return rel, nil, nil, nil, err
	}
	defer res.Close()
	vals := make([]*string, len(rel.Columns))
	dst := make([]any, len(vals))
	for i := range vals {
		dst[i] = &vals[i]
	}
	var out []copiedRow
	bytes := 0
	for res.Next() {
		if err := res.Scan(dst...); err != nil {
			return rel, nil, nil, nil, err
		}
		r := copiedRow{datums: make([]pgcodec.Datum, len(rel.Columns))}
		for i, col := range rel.Columns {
			d := &r.datums[i]
			d.Name = col.Name
			if vals[i] == nil {
				d.Kind = pgcodec.Null
			} else {
				d.Kind, d.Text = pgcodec.Text, []byte(*vals[i])
				bytes += len(d.Text)
			}
			if col.Key {
				r.key = append(r.key, d.Text)
			}
		}
		out = append(out, r)
		if bytes >= copyChunkBytes {
			break
		}
	}
	res.Close()
	if err := res.Err(); err != nil {
		return rel, nil, nil, nil, err
	}
	if len(out) < s.opts.CopyChunkRows && bytes < copyChunkBytes {
		return rel, out, nil, xip, nil // the table's end
	}
	return rel, out, out[len(out)-1].key, xip, nil
}

// chunkQuery selects a chunk of rel's rows after the key after, its
// columns as text, in key order (the key's index serves both).
func chunkQuery(rel pgcodec.Relation, after [][]byte, limit int) (string, []any) {
	cols := make([]string, len(rel.Columns))
	var keys, params []string
	var args []any
	for i, c := range rel.Columns {
		// Qualified: ORDER BY "id" would sort by the output column of
		// that name, the text.
		cols[i] = "t." + pgcodec.QuoteIdent(c.Name) + "::text"
		if c.Key {
			keys = append(keys, "t."+pgcodec.QuoteIdent(c.Name))
			if after != nil {
				args = append(args, string(after[len(args)]))
				params = append(params, fmt.Sprintf("$%d::text::%s", len(args), c.Type))
			}
		}
	}
	q := "SELECT " + strings.Join(cols, ", ") + " FROM " + rel.QualifiedName() + " t"
	if after != nil {
		q += " WHERE (" + strings.Join(keys, ", ") + ") > (" + strings.Join(params, ", ") + ")"
	}
	return q + " ORDER BY " + strings.Join(keys, ", ") + fmt.Sprintf(" LIMIT %d", limit), args
}

// snapshotInProgress returns the in-progress transactions of a snapshot
// in pg_current_snapshot's text form (xmin:xmax:xip,...), as the 32-bit
// xids the stream and pg_stat_activity show.
func snapshotInProgress(snap string) []uint32 {
	parts := strings.SplitN(snap, ":", 3)
	if len(parts) < 3 || parts[2] == "" {
		return nil
	}
	var out []uint32
	for _, x := range strings.Split(parts[2], ",") {
		if v, err := strconv.ParseUint(x, 10, 64); err == nil {
			out = append(out, uint32(v))
		}
	}
	return out
}

// xidTexts are xids as text.
func xidTexts(xids []uint32) []string {
	out := make([]string, len(xids))
	for i, x := range xids {
		out[i] = strconv.FormatUint(uint64(x), 10)
	}
	return out
}

// recentCommits is how many of the stream's last commits' xids are kept
// (Source.recentXids), to find a chunk snapshot's in-progress transaction
// that the stream decoded before the low watermark.
const recentCommits = 4096

// noteCommit keeps a decoded commit's xid (the stream goroutine's).
func (s *Source) noteCommit(xid uint32) {
	s.recentXids[s.recentN%recentCommits] = xid
	s.recentN++
}

// committedBefore reports whether the stream decoded the commit of one of
// xids among the commits before the n-th (as far back as it keeps them).
func (s *Source) committedBefore(xids []uint32, n uint64) bool {
	if s.opts.skipRecentCheck || len(xids) == 0 {
		return false
	}
	from := uint64(0)
	if s.recentN > recentCommits {
		from = s.recentN - recentCommits
	}
	for i := from; i < n; i++ {
		if slices.Contains(xids, s.recentXids[i%recentCommits]) {
			return true
		}
	}
	return false
}

// dropCopy takes a chunk out of the registry (its copy gave up on it):
// the stream forgets its window at the table's next change.
func (s *Source) dropCopy(c *copyChunk) {
	s.mu.Lock()
	delete(s.mu.copies, c.id)
	s.mu.Unlock()
}

// finishCopy ends a chunk the stream has pushed (at ts) or sends back.
func (s *Source) finishCopy(c *copyChunk, ts common.Ts, retry bool) {
	s.mu.Lock()
	_, live := s.mu.copies[c.id]
	delete(s.mu.copies, c.id)
	s.mu.Unlock()
	if live {
		c.ts, c.retry = ts, retry
		close(c.done)
	}
}

// copyMark handles a watermark in the stream (the stream goroutine's).
func (ss *session) copyMark(ctx context.Context, m msgMessage) error {
	s := ss.s
	kind, id, ok := strings.Cut(string(m.content), ":")
	if !ok || !m.transactional || ss.cur == nil {
		return nil
	}
	s.mu.Lock()
	c := s.mu.copies[id]
	ready := c != nil && c.ready
	s.mu.Unlock()
	if c == nil {
		return nil // another process's, or given up
	}
	switch kind {
	case "low":
		c.window, c.truncated, c.relNew, c.relFirst = map[string]struct{}{}, false, false, false
		c.lowN = s.recentN
		ws := s.copyWindows[c.oid]
		for i, x := range ws {
			if x == c {
				ws = append(ws[:i:i], ws[i+1:]...)
				break
			}
		}
		s.copyWindows[c.oid] = append(ws, c)
	case "high":
		s.closeWindow(c)
		if !ready || c.window == nil || c.truncated || c.relNew || len(ss.subs[c.oid]) == 0 || s.committedBefore(c.xip, c.lowN) {
			s.finishCopy(c, ss.cur.ts, true)
			return nil
		}
		known, ok := ss.known[c.oid]
		if ok && c.relFirst && !sameShape(known, c.rel) {
			// The stream's description is of a change after the chunk's
			// snapshot: which one is newer is not known.
			s.finishCopy(c, ss.cur.ts, true)
			return nil
		}
		if !ok || !sameShape(known, c.rel) {
			if err := ss.adopt(c.rel); err != nil {
				return err
			}
		}
		for _, r := range c.rows {
			if _, touched := c.window[windowKey(r.key)]; touched {
				continue
			}
			if err := ss.add(ctx, c.oid, pgcodec.Insert, r.key, pgcodec.RowChange{Change: pgcodec.Insert, Columns: r.datums}); err != nil {
				return err
			}
			s.met.copyRows.Inc()
			c.pushed++
		}
		ss.cur.copied = append(ss.cur.copied, c)
	}
	return nil
}

// closeWindow stops noting the changes of c's table for c.
func (s *Source) closeWindow(c *copyChunk) {
	ws := s.copyWindows[c.oid]
	for i, x := range ws {
		if x == c {
			ws = append(ws[:i:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(s.copyWindows, c.oid)
	} else {
		s.copyWindows[c.oid] = ws
	}
}

// touchCopies notes a change of a table in the windows open on it.
func (ss *session) touchCopies(ws []*copyChunk, c pgcodec.Change, key [][]byte, change *pgcodec.RowChange) {
	s := ss.s
	for _, w := range ws {
		s.mu.Lock()
		_, live := s.mu.copies[w.id]
		s.mu.Unlock()
		if !live {
			s.closeWindow(w) // given up
			continue
		}
		switch c {
		case pgcodec.Truncate:
			w.truncated = true
		case pgcodec.Move:
			from := make([][]byte, len(change.From))
			for i, d := range change.From {
				from[i] = d.Text
			}
			w.window[windowKey(from)] = struct{}{}
			w.window[windowKey(key)] = struct{}{}
		default:
			w.window[windowKey(key)] = struct{}{}
		}
	}
}

// relationChanged marks the windows open on a table that got a new
// relation version (seen: one replaced a version the stream knew) or its
// first description in this stream.
func (s *Source) relationChanged(oid uint32, seen bool) {
	for _, w := range s.copyWindows[oid] {
		if seen {
			w.relNew = true
		} else {
			w.relFirst = true
		}
	}
}

// windowKey is a key's text as a map key (each part length-prefixed).
func windowKey(key [][]byte) string {
	n := 0
	for _, k := range key {
		n += 4 + len(k)
	}
	b := make([]byte, 0, n)
	for _, k := range key {
		b = binary.BigEndian.AppendUint32(b, uint32(len(k)))
		b = append(b, k...)
	}
	return string(b)
}

// sameShape compares two relation versions by what the rows carry:
// names, types and keys (not the catalog's value for rows from before a
// column, which only a stream's description of an added column has).
func sameShape(a, b pgcodec.Relation) bool {
	if a.Schema != b.Schema || a.Name != b.Name || len(a.Columns) != len(b.Columns) {
		return false
	}
	for i := range a.Columns {
		x, y := a.Columns[i], b.Columns[i]
		if x.Name != y.Name || x.TypeOID != y.TypeOID || x.Type != y.Type || x.Key != y.Key || x.Base != y.Base {
			return false
		}
	}
	return true
}

package pgsource

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcflow/eventservice/internal/backoff"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// The copy of a table that joins while streaming (CopyTable): its rows
// are read in chunks in its key's order, each between two watermarks the
// stream itself carries, and pushed into the stream at the second one's
// commit (DBLog's watermarks):
//
//  1. a low watermark, a transactional logical message, is committed;
//  2. a REPEATABLE READ transaction begun after it locks the table (ACCESS
//     SHARE: a rewrite holding it would leave an earlier snapshot that sees
//     it empty), takes its snapshot and reads the chunk, by the columns'
//     output functions (as pgoutput prints them: a cast to text prints
//     some keys differently);
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
// pgoutput's rows are not always whole: an update that leaves a TOASTed
// value alone carries it as unchanged, and the sink keeps the value the
// target has, which a row not yet copied has not. A touched key whose
// changes in the window left such a value unknown, and the new key of a
// move (a key change with an unchanged value, pgcodec.Move, whose value
// the sink takes from the old row in the target) at any time during the
// copy, are read again once the ranges are done (keyed chunks, under
// watermarks the same way), until a round leaves none.
//
// The one gap: a transaction whose commit is in the WAL before the low
// watermark (so outside the window) but not yet visible to the chunk's
// snapshot. Two checks find one: its backend waits for a synchronous
// standby since before the chunk's transaction began (pg_stat_activity,
// SyncRep: the copy's role needs to see other roles' sessions,
// pg_read_all_stats), or the stream decoded its commit among the last
// recentCommits before the low watermark (the chunk keeps them from
// there); the chunk is then read again later (errSnapshotAhead, or sent
// back). A commit decoded earlier than those and still invisible without
// a SyncRep wait the role can see is not found.
//
// A truncate or a new relation version of the table in the window, or a
// table without a subscription at the high watermark, sends the chunk
// back to be read again too. Memory: one chunk per copy (CopyChunkRows
// rows, at most copyChunkBytes of values; keyed chunks keyedChunkRows
// rows) and the keys to read again.

// copyPrefix marks the watermarks of a copy (pg_logical_emit_message).
const copyPrefix = "cdcflow-copy"

// copyChunkBytes bounds the values one chunk holds.
const copyChunkBytes = 16 << 20

// keyedChunkRows bounds the rows of a chunk read by key (each may be
// large: it had an unchanged TOASTed value).
const keyedChunkRows = 64

// errSnapshotAhead: the chunk's snapshot misses a commit the stream may
// have passed before the low watermark; the chunk is read again.
var errSnapshotAhead = errors.New("pgsource: a commit before the low watermark is not yet visible")

// copyState is one CopyTable's, shared with the stream from its first low
// watermark (streamState.copyTables) until the stream finds it done.
type copyState struct {
	oid   uint32
	fresh bool // a truncate at the first chunk's low watermark
	// abandoned: the copy gave up; the stream forgets it.
	abandoned atomic.Bool
	// refetch are the keys to read again, by windowKey (the stream's).
	refetch map[string][][]byte
}

// copyChunk is one chunk of a copy, from its registration to its push.
type copyChunk struct {
	id   string
	st   *copyState
	done chan struct{} // closed once pushed (ts) or sent back (retry)

	// Set by the copier under Source.copies before the high watermark is
	// written, read by the stream under it after that watermark decoded.
	ready bool
	rel   pgcodec.Relation
	rows  []copiedRow
	// sees is the chunk's snapshot: its in-progress transactions (the
	// gap check) and, for a keyless chunk, what it saw.
	sees snapshotSees
	// first: the ranges' first chunk (a fresh copy truncates at its low
	// watermark).
	first bool
	// final: the ranges are done (this is their last chunk, or a keyed
	// one): the stream hands the keys to read again over. last: and the
	// copier has no keys left to read besides.
	final, last bool

	// keyless: the table has no key (copy_keyless.go); set before the low
	// watermark is written.
	keyless bool

	// Owned by the stream goroutine from the low watermark on.
	window    map[string]*touch
	held      []heldChange // a keyless chunk's changes in the window
	before    []uint32     // the xids of the commits decoded before the low watermark (the last recentCommits)
	truncated bool         // a truncate in the window
	relNew    bool         // a new relation version in the window
	relFirst  bool         // the stream's first description of the table in the window

	// Set by the stream before done is closed.
	ts      common.Ts
	retry   bool
	pushed  int        // rows pushed (the others were touched in the window)
	refetch [][][]byte // keys to read again (final chunks)
	ended   bool       // the copy is done: the stream forgot its state
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
	// not: the stream delivered its newer version; a row read again is
	// counted again).
	Rows int64
	// Chunks pushed, Retries chunks read again, Refetched keys read again.
	Chunks, Retries, Refetched int
}

// CopyTable copies the rows table oid holds into the stream, in chunks
// between watermarks (see above), and returns once the stream has pushed
// the last one. fresh empties the table's subscriptions first, in the
// stream's order (a truncate at the first chunk's low watermark): for a
// table whose changes the stream missed for a while (OnRejoin), whose
// target holds rows deleted meanwhile. The table must have a subscription from below the
// current stream position (a chunk whose table has none is read again
// until it has). One copy per table at a time. A table that is gone is
// ErrTableGone; a table without a key ErrUnreplicable.
func (s *Source) CopyTable(ctx context.Context, oid uint32, fresh bool) (CopyResult, error) {
	var res CopyResult
	conn, err := connectCopy(ctx, s.opts.DSN)
	if err != nil {
		return res, err
	}
	defer conn.Close(context.Background())
	st := &copyState{oid: oid, fresh: fresh, refetch: map[string][][]byte{}}
	defer func() { // a no-op for the stream once the copy ended
		st.abandoned.Store(true)
		s.copyDrops.Add(1) // the stream forgets it at its next message
	}()
	var after [][]byte
	var refetch [][][]byte
	ranged := true
	pause := newCopyBackoff(s)
	for {
		req := chunkReq{after: after}
		if !ranged {
			req = chunkReq{keys: refetch[:min(len(refetch), keyedChunkRows)]}
			req.last = len(req.keys) == len(refetch)
		}
		c, last, err := s.copyChunk(ctx, conn, st, req)
		switch {
		case errors.Is(err, errSnapshotAhead) || err == nil && c.retry:
			res.Retries++
			s.met.copyRetries.Inc()
			if err := pause.wait(ctx); err != nil {
				return res, err
			}
			continue
		case err != nil:
			return res, err
		}
		pause.reset()
		res.Chunks++
		res.Ts = c.ts
		res.Rows += int64(c.pushed)
		if ranged {
			after, ranged = last, last != nil
		} else {
			res.Refetched += len(req.keys)
			refetch = refetch[len(req.keys):]
		}
		refetch = append(refetch, c.refetch...)
		if c.ended {
			return res, nil
		}
	}
}

// chunkReq is what a chunk reads: the rows after the key after (nil: from
// the first), or the rows of keys.
type chunkReq struct {
	after [][]byte
	keys  [][][]byte
	last  bool // keyed: no keys left to read besides
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

// copyBackoff spaces the reads of a chunk sent back: 20ms doubling up to
// 2s, no jitter (one copy, no herd), back to 20ms after a chunk that went
// in.
type copyBackoff struct {
	s *Source
	b backoff.Backoff
}

func newCopyBackoff(s *Source) *copyBackoff {
	return &copyBackoff{s: s, b: backoff.Backoff{Base: 20 * time.Millisecond, Max: 2 * time.Second}}
}

func (b *copyBackoff) reset() { b.b.Reset() }

func (b *copyBackoff) wait(ctx context.Context) error {
	t := b.s.opts.Clock.NewTimer(b.b.Next())
	defer t.Stop()
	select {
	case <-t.C():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-b.s.ctx.Done():
		return ErrClosed
	}
}

// copyChunk reads and pushes one chunk. last is the key the ranges
// continue after, nil once they are done (or for a keyed chunk).
func (s *Source) copyChunk(ctx context.Context, conn *pgx.Conn, st *copyState, req chunkReq) (c *copyChunk, last [][]byte, err error) {
	keyless, err := s.tableKeyless(ctx, conn, st.oid)
	if err != nil {
		return nil, nil, err
	}
	c = &copyChunk{id: fmt.Sprintf("%s.%d", s.copyNonce, s.copySeq.Add(1)), st: st, done: make(chan struct{}),
		first: req.after == nil && req.keys == nil, keyless: keyless}
	s.mu.Lock()
	closed := s.mu.closed
	s.mu.Unlock()
	if closed {
		return nil, nil, ErrClosed
	}
	s.copies.Lock()
	s.copies.m[c.id] = c
	s.copies.Unlock()
	pushed, chunk := false, c
	defer func() {
		if !pushed {
			s.dropCopy(chunk)
		}
	}()
	if h := s.knobs.copyStartHook; h != nil {
		h()
	}
	if err := emitCopyMark(ctx, conn, "low", c.id); err != nil {
		return nil, nil, err
	}
	rel, rows, last, sees, err := s.readChunk(ctx, conn, st.oid, req, c.keyless)
	if err != nil {
		return nil, nil, err
	}
	s.copies.Lock()
	c.rel, c.rows, c.sees, c.ready = rel, rows, sees, true
	c.final = req.keys != nil || last == nil
	c.last = c.final && (req.keys == nil || req.last)
	s.copies.Unlock()
	if h := s.knobs.copyHook; h != nil {
		h(st.oid, len(rows))
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

// readChunk reads up to CopyChunkRows rows of oid after the key
// req.after, in key order, or the rows of req.keys, in a snapshot taken
// after the low watermark, with the relation as that snapshot sees it.
func (s *Source) readChunk(ctx context.Context, conn *pgx.Conn, oid uint32, req chunkReq, keyless bool) (rel pgcodec.Relation, rows []copiedRow, last [][]byte, sees snapshotSees, err error) {
	// The table is locked (ACCESS SHARE, as any read) before the
	// snapshot is taken: a rewrite (ALTER TABLE ... TYPE) holding it
	// would otherwise leave a snapshot from before the rewrite that sees
	// the rewritten table empty, and the copy would end there.
	var name, kind string
	err = conn.QueryRow(ctx, "SELECT c.oid::regclass::text, c.relkind::text FROM pg_class c WHERE c.oid = $1", oid).Scan(&name, &kind)
	if errors.Is(err, pgx.ErrNoRows) {
		return rel, nil, nil, sees, fmt.Errorf("%w: table %d", ErrTableGone, oid)
	} else if err != nil {
		return rel, nil, nil, sees, err
	}
	// A plain table's own rows only: an inheritance child's rows are
	// published as the child's. A partitioned table (published through
	// its root) is read with its partitions.
	only := ""
	if kind != "p" {
		only = "ONLY "
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return rel, nil, nil, sees, err
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck // read only
	if _, err := tx.Exec(ctx, "LOCK TABLE "+only+name+" IN ACCESS SHARE MODE"); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table: renamed or dropped meanwhile
			return rel, nil, nil, sees, fmt.Errorf("%w: %w", errSnapshotAhead, err)
		}
		return rel, nil, nil, sees, err
	}
	var snap string
	if err := tx.QueryRow(ctx, "SELECT pg_current_snapshot()::text").Scan(&snap); err != nil {
		return rel, nil, nil, sees, err
	}
	if sees, err = parseSnapshot(snap); err != nil {
		return rel, nil, nil, sees, err
	}
	xip := sees.xip
	if len(xip) > 0 && !s.knobs.skipSyncRepCheck {
		// A backend that began its commit before this transaction did (so
		// possibly before the low watermark's commit) and still waits for
		// a standby: its commit may be in the stream before the window.
		// One that began after is in the window or after it.
		var waiting int
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
WHERE wait_event = 'SyncRep' AND backend_xid::text = ANY($1) AND query_start < now()`, xidTexts(xip)).Scan(&waiting); err != nil {
			return rel, nil, nil, sees, err
		}
		if waiting > 0 {
			return rel, nil, nil, sees, errSnapshotAhead
		}
	}
	var ident, locked string
	err = tx.QueryRow(ctx, `SELECT n.nspname, c.relname, c.relreplident, c.oid::regclass::text FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = $1`, oid).Scan(&rel.Schema, &rel.Name, &ident, &locked)
	if errors.Is(err, pgx.ErrNoRows) {
		return rel, nil, nil, sees, fmt.Errorf("%w: table %d", ErrTableGone, oid)
	} else if err != nil {
		return rel, nil, nil, sees, err
	}
	if locked != name {
		return rel, nil, nil, sees, fmt.Errorf("%w: table %d renamed from %s to %s", errSnapshotAhead, oid, name, locked)
	}
	if len(ident) != 1 {
		// relreplident is a "char": one byte, or the catalog is not what
		// PostgreSQL writes.
		return rel, nil, nil, sees, fmt.Errorf("%w: table %d has replica identity %q", ErrProtocol, oid, ident)
	}
	rel.OID = oid
	if rel.Columns, err = tableColumns(ctx, tx.Conn(), oid, ident[0]); err != nil {
		return rel, nil, nil, sees, err
	}
	pub, err := publishedShape(ctx, tx, s.pubs, rel)
	if err != nil {
		return rel, nil, nil, sees, err
	}
	every := len(rel.Columns)
	rel.Columns = pub.columns(rel.Columns)
	rel.Identity = identityOf(rel.Columns, ident[0]) // after the column list, which may leave the key out
	if len(rel.Columns) == every {
		// Its stored generated columns, as every version the source
		// gives has them (a version without them drops them at the
		// sink), unless a column list leaves columns out (generatedOf).
		gens, err := generatedOf(ctx, tx.Conn(), []uint32{oid})
		if err != nil {
			return rel, nil, nil, sees, err
		}
		rel.Generated = gens[oid]
	}
	if err := rel.Validate(); err != nil {
		return rel, nil, nil, sees, fmt.Errorf("%w: %s: %w", ErrUnreplicable, rel.QualifiedName(), err)
	}
	if rel.Keyless() != keyless {
		// The key came or went since the low watermark: a DDL in the
		// window, which sends the chunk back anyway.
		return rel, nil, nil, sees, fmt.Errorf("%w: table %d's key changed", errSnapshotAhead, oid)
	}
	scope := readScope{from: only + rel.QualifiedName() + " t", filter: pub.rowFilter}
	var query string
	var args []any
	switch {
	case keyless:
		query = keylessQuery(rel, scope)
	case req.keys != nil:
		query, args = keyedQuery(rel, scope, req.keys)
	default:
		order, err := keyOrder(ctx, tx, oid, ident[0], rel)
		if err != nil {
			return rel, nil, nil, sees, err
		}
		query, args = chunkQuery(rel, scope, order, req.after, s.opts.CopyChunkRows)
	}
	// Text results of the columns themselves (their output functions,
	// which pgoutput uses too): a cast to text is another function for
	// some types (true::text is "true", pgoutput's "t"; char(n) drops its
	// padding; inet its /32), and a key the chunk and the stream print
	// differently would never be found touched.
	res, err := tx.Query(ctx, query, append([]any{pgx.QueryResultFormats{pgx.TextFormatCode}}, args...)...)
	if err != nil {
		return rel, nil, nil, sees, err
	}
	defer res.Close()
	var out []copiedRow
	bytes := 0
	for res.Next() {
		// The raw text, never Scan: pgx scans a json value of JSON null
		// into a nil pointer, which would be SQL NULL.
		vals := res.RawValues()
		if len(vals) != len(rel.Columns) {
			return rel, nil, nil, sees, fmt.Errorf("%w: a chunk row of %d columns, not %d", ErrProtocol, len(vals), len(rel.Columns))
		}
		r := copiedRow{datums: make([]pgcodec.Datum, len(rel.Columns))}
		for i, col := range rel.Columns {
			d := &r.datums[i]
			d.Name = col.Name
			if vals[i] == nil {
				d.Kind = pgcodec.Null
			} else {
				d.Kind, d.Text = pgcodec.Text, slices.Clone(vals[i])
				bytes += len(d.Text)
			}
			if col.Key {
				r.key = append(r.key, d.Text)
			}
		}
		out = append(out, r)
		if keyless && bytes > s.opts.KeylessCopyBytes {
			return rel, nil, nil, sees, fmt.Errorf("%w: %s holds more than %d bytes of values (KeylessCopyBytes)", ErrKeylessTooLarge,
				rel.QualifiedName(), s.opts.KeylessCopyBytes)
		}
		if bytes >= copyChunkBytes && req.keys == nil && !keyless {
			break
		}
	}
	res.Close()
	if err := res.Err(); err != nil {
		return rel, nil, nil, sees, err
	}
	if keyless || req.keys != nil || len(out) < s.opts.CopyChunkRows && bytes < copyChunkBytes {
		return rel, out, nil, sees, nil // the table's end
	}
	return rel, out, out[len(out)-1].key, sees, nil
}

// chunkQuery selects a chunk of rel's rows after the key after (its
// parts in column order), in the key index's order (order: the key parts'
// positions, index column first), which the index serves.
func chunkQuery(rel pgcodec.Relation, scope readScope, order []int, after [][]byte, limit int) (string, []any) {
	var keys, types []string
	for _, c := range rel.Columns {
		if c.Key {
			keys = append(keys, "t."+pgcodec.QuoteIdent(c.Name))
			types = append(types, c.Type)
		}
	}
	if len(after) != len(keys) {
		after = nil // the key changed between two chunks (which stops the table): from the first row again
	}
	names, params := make([]string, len(order)), make([]string, len(order))
	var args []any
	for i, k := range order {
		names[i] = keys[k]
		if after != nil {
			args = append(args, string(after[k]))
			params[i] = fmt.Sprintf("$%d::text::%s", len(args), types[k])
		}
	}
	var where []string
	if scope.filter != "" {
		where = append(where, "("+scope.filter+")")
	}
	if after != nil {
		where = append(where, "("+strings.Join(names, ", ")+") > ("+strings.Join(params, ", ")+")")
	}
	q := "SELECT " + selectList(rel) + " FROM " + scope.from
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	return q + " ORDER BY " + strings.Join(names, ", ") + fmt.Sprintf(" LIMIT %d", limit), args
}

// selectList is rel's columns, qualified: ORDER BY "id" would sort by an
// output column of that name.
func selectList(rel pgcodec.Relation) string {
	cols := make([]string, len(rel.Columns))
	for i, c := range rel.Columns {
		cols[i] = "t." + pgcodec.QuoteIdent(c.Name)
	}
	return strings.Join(cols, ", ")
}

// keyOrder returns the positions of rel's key parts (in column order) in
// the order of the key's index (the replica identity index, or the
// primary key): PRIMARY KEY (b, a) on columns (a, b) is [1, 0].
func keyOrder(ctx context.Context, tx pgx.Tx, oid uint32, ident byte, rel pgcodec.Relation) ([]int, error) {
	rows, err := tx.Query(ctx, `SELECT a.attname FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = $1 AND CASE WHEN $2 = 'i' THEN i.indisreplident ELSE i.indisprimary END AND k.n <= i.indnkeyatts
ORDER BY k.n`, oid, string([]byte{ident}))
	if err != nil {
		return nil, err
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	var keys []string
	for _, c := range rel.Columns {
		if c.Key {
			keys = append(keys, c.Name)
		}
	}
	order := make([]int, 0, len(keys))
	for _, n := range names {
		if i := slices.Index(keys, n); i >= 0 && !slices.Contains(order, i) {
			order = append(order, i)
		}
	}
	if len(order) != len(keys) { // not what tableColumns found: column order then
		order = order[:0]
		for i := range keys {
			order = append(order, i)
		}
	}
	return order, nil
}

// keyedQuery selects rel's rows of keys, their columns as text.
func keyedQuery(rel pgcodec.Relation, scope readScope, keys [][][]byte) (string, []any) {
	var names, types []string
	for _, c := range rel.Columns {
		if c.Key {
			names = append(names, "t."+pgcodec.QuoteIdent(c.Name))
			types = append(types, c.Type)
		}
	}
	var args []any
	var tuples []string
	for _, k := range keys {
		if len(k) != len(types) {
			continue // noted under another key: the table's key changed, which stops it
		}
		params := make([]string, len(k))
		for j, part := range k {
			args = append(args, string(part))
			params[j] = fmt.Sprintf("$%d::text::%s", len(args), types[j])
		}
		tuples = append(tuples, "("+strings.Join(params, ", ")+")")
	}
	if len(tuples) == 0 {
		return "SELECT " + selectList(rel) + " FROM " + scope.from + " WHERE false", nil
	}
	filter := ""
	if scope.filter != "" {
		filter = "(" + scope.filter + ") AND "
	}
	return "SELECT " + selectList(rel) + " FROM " + scope.from + " WHERE " + filter + "(" + strings.Join(names, ", ") +
		") IN (" + strings.Join(tuples, ", ") + ")", args
}

// xidTexts are xids as text.
func xidTexts(xids []uint32) []string {
	out := make([]string, len(xids))
	for i, x := range xids {
		out[i] = strconv.FormatUint(uint64(x), 10)
	}
	return out
}

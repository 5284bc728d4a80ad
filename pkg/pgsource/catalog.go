package pgsource

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcflow/eventservice/internal/pgdial"
	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// What the source reads of the catalog and how it connects: regular
// connections (the snapshot, the copies, a start's checks), replication
// ones (the stream, the slot's creation), control ones (the side tasks,
// the session's catalog queries); wal_level, the published tables with
// their columns and keys, type names and base types. Invariants: every
// name that becomes SQL is quoted or was checked as an identifier; nothing
// here writes the user's database but the slot's creation and drop
// (releaseSlot terminates only a walsender attached to the changefeed's
// own slot, checked by checkSlotIsOurs first).

// connect opens a regular connection to the source.
func connect(ctx context.Context, dsn string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConnect, err)
	}
	for k, v := range pgcodec.TextFormatParams() { // the snapshot's rows are text in them
		cfg.RuntimeParams[k] = v
	}
	pgdial.Apply(&cfg.Config) // a dead host fails the connection (package pgdial)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConnect, err)
	}
	return conn, nil
}

// connectControl opens the connection a long-lived task of the source
// keeps (the heartbeat, the publication poll, a session's catalog
// queries): a replication connection in database mode, which runs SQL
// over the simple query protocol. Because a smart shutdown of the source
// waits for every regular client to leave, and walsenders are not
// regular clients: a regular connection kept open would hold the
// shutdown for as long as serve runs, where this one is asked to leave
// once the regular clients are gone (its walsender is terminated before
// the shutdown checkpoint, as native subscribers' are). Its cost is a
// WAL sender slot (max_wal_senders), not a client connection.
func connectControl(ctx context.Context, dsn string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConnect, err)
	}
	for k, v := range pgcodec.TextFormatParams() {
		cfg.RuntimeParams[k] = v
	}
	cfg.RuntimeParams["replication"] = "database"
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol // a walsender parses simple queries only
	pgdial.Apply(&cfg.Config)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConnect, err)
	}
	return conn, nil
}

// connectReplication opens a logical replication connection.
// Its socket is a lingerConn, which lingers (linger > 0) only once the
// session streams (lingerOf(conn).stream) and counts the bytes read (the
// stream's liveness, whatever the linger).
func connectReplication(ctx context.Context, dsn string, linger time.Duration) (*pgconn.PgConn, error) {
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConnect, err)
	}
	for k, v := range pgcodec.TextFormatParams() { // pgoutput's values are text in them
		cfg.RuntimeParams[k] = v
	}
	cfg.RuntimeParams["replication"] = "database"
	pgdial.Apply(cfg)
	var last *lingerConn // the socket of the dial that connected (pgconn dials again for a fallback)
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		last = newLingerConn(c, max(linger, 0))
		return last, nil
	}
	conn, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: replication connection: %w", ErrConnect, err)
	}
	// Kept with the connection, not found again from conn.Conn(), which
	// is the TLS layer above it when TLS was negotiated.
	conn.CustomData()[lingerKey] = last
	return conn, nil
}

// checkLogical fails with ErrNotLogical unless wal_level is logical.
func checkLogical(ctx context.Context, conn *pgx.Conn) error {
	var level string
	if err := conn.QueryRow(ctx, "SHOW wal_level").Scan(&level); err != nil {
		return fmt.Errorf("%w: SHOW wal_level: %w", ErrConnect, err)
	}
	if level != "logical" {
		return fmt.Errorf("%w: it is %q; set wal_level = logical and restart the server", ErrNotLogical, level)
	}
	return nil
}

// catalogTable is a published table as the catalog describes it now.
type catalogTable struct {
	oid         uint32
	schema      string
	name        string
	replIdent   byte
	columns     []pgcodec.Column
	generated   []pgcodec.GeneratedColumn
	reltuples   float64
	kind        string // pg_class.relkind: "p" for a partitioned table (published through its root)
	pub         pubShape
	relationErr error // why it cannot be replicated (no key), or nil
}

// publishedTables lists the publication's tables with their columns and
// keys. A table without a usable key is listed with relationErr set.
func publishedTables(ctx context.Context, conn *pgx.Conn, pubs []string) ([]catalogTable, error) {
	rows, err := conn.Query(ctx, `
SELECT c.oid, n.nspname, c.relname, c.relreplident, greatest(c.reltuples, 0), c.relkind::text, `+pubShapeColumns+`
FROM pg_publication_tables pt
JOIN pg_namespace n ON n.nspname = pt.schemaname
JOIN pg_class c ON c.relnamespace = n.oid AND c.relname = pt.tablename
WHERE pt.pubname = ANY($1) AND pt.schemaname <> '`+ToolSchema+`'
ORDER BY n.nspname, c.relname`, pubs)
	if err != nil {
		return nil, err
	}
	var tables []catalogTable
	for rows.Next() {
		var t catalogTable
		var ident string
		if err := rows.Scan(&t.oid, &t.schema, &t.name, &ident, &t.reltuples, &t.kind, &t.pub.attnames, &t.pub.rowFilter); err != nil {
			rows.Close()
			return nil, err
		}
		if ident != "" {
			t.replIdent = ident[0]
		}
		tables = append(tables, t)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	oids, idents := make([]uint32, len(tables)), make([]byte, len(tables))
	for i, t := range tables {
		oids[i], idents[i] = t.oid, t.replIdent
	}
	// One query for every table's columns: one per table is a round trip
	// per table at every restart.
	cols, err := tablesColumns(ctx, conn, oids, idents)
	if err != nil {
		return nil, err
	}
	gens, err := generatedOf(ctx, conn, oids)
	if err != nil {
		return nil, err
	}
	for i := range tables {
		t := &tables[i]
		t.columns = t.pub.columns(cols[t.oid])
		if len(t.columns) == len(cols[t.oid]) {
			t.generated = gens[t.oid] // see generatedOf
		}
		if err := t.relation().Validate(); err != nil {
			t.relationErr = fmt.Errorf("%w: %s.%s: %w", ErrUnreplicable, t.schema, t.name, err)
		}
	}
	return tables, nil
}

// only is what reads the table's own rows: "ONLY " but for a partitioned
// table (its partitions' rows are its own), so that an inheritance
// parent's copy leaves its children's rows to them.
func (t catalogTable) only() string {
	if t.kind == "p" {
		return ""
	}
	return "ONLY "
}

func (t catalogTable) relation() pgcodec.Relation {
	return pgcodec.Relation{OID: t.oid, Schema: t.schema, Name: t.name, Columns: t.columns, Identity: identityOf(t.columns, t.replIdent),
		Generated: t.generated}
}

// identityOf is the pgcodec.Relation.Identity of a table with columns cols
// (as published) and replica identity replIdent: none for a table with a
// key column; full for REPLICA IDENTITY FULL without one (its updates and
// deletes carry the whole old row); none otherwise (PostgreSQL streams
// only its inserts and truncates).
func identityOf(cols []pgcodec.Column, replIdent byte) string {
	for _, c := range cols {
		if c.Key {
			return ""
		}
	}
	if replIdent == 'f' {
		return pgcodec.IdentityFull
	}
	return pgcodec.IdentityNone
}

// tableColumns returns a table's replicated columns (generated columns are
// not) with the key: the replica identity index for REPLICA IDENTITY
// USING INDEX, else the primary key (REPLICA IDENTITY FULL keeps the
// primary key as the key: a sink upserts by it). NOTHING has no key.
func tableColumns(ctx context.Context, conn *pgx.Conn, oid uint32, replIdent byte) ([]pgcodec.Column, error) {
	cols, err := tablesColumns(ctx, conn, []uint32{oid}, []byte{replIdent})
	return cols[oid], err
}

// tablesColumns is tableColumns of many tables in one query, by OID;
// idents[i] is the replica identity of oids[i].
func tablesColumns(ctx context.Context, conn *pgx.Conn, oids []uint32, idents []byte) (map[uint32][]pgcodec.Column, error) {
	identArg := make([]string, len(idents))
	for i, b := range idents {
		identArg[i] = string([]byte{b})
	}
	rows, err := conn.Query(ctx, `
SELECT t.oid, a.attname, format_type(a.atttypid, a.atttypmod), a.atttypid, a.atttypmod,
       coalesce(a.attnum = ANY(k.indkey), false), a.atthasmissing, (a.attmissingval::text::text[])[1], a.attnum
FROM unnest($1::oid[], $2::text[]) AS t(oid, ident)
JOIN pg_attribute a ON a.attrelid = t.oid
LEFT JOIN LATERAL (
  -- the key's columns, not those an INCLUDE adds (pgoutput does not mark them)
  SELECT (i.indkey::int2[])[0:i.indnkeyatts - 1] AS indkey FROM pg_index i
  WHERE i.indrelid = a.attrelid AND t.ident <> 'n' AND CASE WHEN t.ident = 'i' THEN i.indisreplident ELSE i.indisprimary END
  LIMIT 1) k ON true
WHERE a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''
ORDER BY t.oid, a.attnum`, oids, identArg)
	if err != nil {
		return nil, err
	}
	cols := make(map[uint32][]pgcodec.Column, len(oids))
	type userCol struct {
		table uint32
		i     int
	}
	var user []typeRef
	var at []userCol
	for rows.Next() {
		var oid uint32
		var c pgcodec.Column
		var mod int32
		var missing *string
		if err := rows.Scan(&oid, &c.Name, &c.Type, &c.TypeOID, &mod, &c.Key, &c.HasMissing, &missing, &c.Num); err != nil {
			rows.Close()
			return nil, err
		}
		c.HasMissing = c.HasMissing && missing != nil
		if c.HasMissing {
			c.Missing = *missing
		}
		if c.TypeOID >= firstUserOID {
			user = append(user, typeRef{oid: c.TypeOID, mod: mod})
			at = append(at, userCol{table: oid, i: len(cols[oid])})
		}
		cols[oid] = append(cols[oid], c)
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(user) == 0 {
		return cols, err
	}
	bases, err := baseTypes(ctx, conn, user)
	if err != nil {
		return nil, err
	}
	for k, u := range at {
		b, ok := bases[user[k]]
		if !ok {
			b = "text" // a type gone from the catalog meanwhile: its text form still fits
		}
		cols[u.table][u.i].Base = b
	}
	return cols, nil
}

// generatedOf reads the stored generated columns of tables oids, by OID,
// with the source's expressions (pg_get_expr: a target computes them,
// since PostgreSQL 15 publishes no value of theirs). A caller keeps them
// only for a table whose every column is published: an expression may
// read a column a publication's column list leaves out.
func generatedOf(ctx context.Context, conn *pgx.Conn, oids []uint32) (map[uint32][]pgcodec.GeneratedColumn, error) {
	rows, err := conn.Query(ctx, `
SELECT a.attrelid, a.attname, format_type(a.atttypid, a.atttypmod), pg_get_expr(d.adbin, d.adrelid)
FROM pg_attribute a JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = ANY($1::oid[]) AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = 's'
ORDER BY a.attrelid, a.attnum`, oids)
	if err != nil {
		return nil, err
	}
	out := map[uint32][]pgcodec.GeneratedColumn{}
	for rows.Next() {
		var oid uint32
		var g pgcodec.GeneratedColumn
		if err := rows.Scan(&oid, &g.Name, &g.Type, &g.Expr); err != nil {
			rows.Close()
			return nil, err
		}
		out[oid] = append(out[oid], g)
	}
	rows.Close()
	return out, rows.Err()
}

// firstUserOID is PostgreSQL's FirstNormalObjectId: every built-in type
// has an OID below it, every type a database created (an enum, a domain, a
// composite, an extension's) one at or above it.
const firstUserOID = 16384

// typeRef is a column's type: its OID and typmod.
type typeRef struct {
	oid uint32
	mod int32
}

// baseTypes returns the built-in type a sink may create each of refs (all
// created types) as, for a target that may not have them: a domain's base
// type, followed through domains over domains, and text for everything
// else (an enum's label, a composite's or a range's text form, an
// extension's type), with [] for an array of any of them. The text forms
// are what the source sends, so the target stores the same text.
func baseTypes(ctx context.Context, conn *pgx.Conn, refs []typeRef) (map[typeRef]string, error) {
	oids, mods := make([]uint32, len(refs)), make([]int32, len(refs))
	for i, r := range refs {
		oids[i], mods[i] = r.oid, r.mod
	}
	// Each step goes from a domain to its base type, or from an array to
	// its element; the last step of each type is a built-in type
	// (formatted) or a created one that is neither (text), with one []
	// per array step.
	rows, err := conn.Query(ctx, `
WITH RECURSIVE r(orig, origmod, oid, mod, arrays, depth) AS (
  SELECT u.o, u.m, u.o, u.m, 0, 0 FROM unnest($1::oid[], $2::int4[]) AS u(o, m)
  UNION ALL
  SELECT r.orig, r.origmod,
         CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.typelem END,
         CASE WHEN t.typtype = 'd' THEN t.typtypmod ELSE -1 END,
         r.arrays + CASE WHEN t.typtype = 'd' THEN 0 ELSE 1 END,
         r.depth + 1
  FROM r JOIN pg_type t ON t.oid = r.oid
  WHERE r.oid >= $3 AND r.depth < 16 AND (t.typtype = 'd' OR (t.typcategory = 'A' AND t.typelem <> 0))
)
SELECT DISTINCT ON (orig, origmod) orig, origmod,
       CASE WHEN oid < $3 THEN format_type(oid, mod) ELSE 'text' END || repeat('[]', arrays)
FROM r ORDER BY orig, origmod, depth DESC`, oids, mods, firstUserOID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := make(map[typeRef]string, len(refs))
	for rows.Next() {
		var r typeRef
		var base string
		if err := rows.Scan(&r.oid, &r.mod, &base); err != nil {
			return nil, err
		}
		out[r] = base
	}
	return out, rows.Err()
}

// slotLSN returns the slot's confirmed flush LSN, or ok false if there is
// no such slot.
func slotLSN(ctx context.Context, conn *pgx.Conn, slot string) (lsn uint64, ok bool, err error) {
	var s *string
	err = conn.QueryRow(ctx, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&s)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	if s == nil {
		return 0, false, fmt.Errorf("slot %s has no confirmed flush LSN (is it a logical slot?)", slot)
	}
	l, err := pglogrepl.ParseLSN(*s)
	return uint64(l), true, err
}

// slotWait bounds the wait for a walsender to leave the slot: one that
// was terminated, or, without a take-over, one whose client closed its
// connection (it exits within milliseconds) or died (the server notices at
// its next write, a keepalive at the latest).
const slotWait = 10 * time.Second

// releaseSlot makes sure no walsender is attached to the slot. With
// takeOver it terminates the one that is (pg_terminate_backend with a
// timeout waits for the process to exit); without, it waits up to
// slotWait for it to leave, on clk, then fails with ErrSlotInUse. A slot
// that does not exist is released.
func releaseSlot(ctx context.Context, conn *pgx.Conn, slot string, takeOver bool, clk clock.Clock) error {
	deadline := clk.Now().Add(slotWait)
	for tries := 0; ; tries++ {
		var pid *int32
		err := conn.QueryRow(ctx, "SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", slot).Scan(&pid)
		if errors.Is(err, pgx.ErrNoRows) || err == nil && pid == nil {
			return nil
		}
		if err != nil {
			return err
		}
		if !takeOver || tries >= 3 { // taken again at once after each take-over: give up
			if !clk.Now().Before(deadline) || takeOver {
				return fmt.Errorf("%w: slot %s is attached to walsender pid %d", ErrSlotInUse, slot, *pid)
			}
			t := clk.NewTimer(50 * time.Millisecond) // polling the server's state, bounded by deadline
			select {
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			case <-t.C():
			}
			continue
		}
		var gone bool
		if err := conn.QueryRow(ctx, "SELECT pg_terminate_backend($1, $2)", *pid, slotWait.Milliseconds()).Scan(&gone); err != nil {
			return fmt.Errorf("pgsource: take over slot %s from pid %d: %w", slot, *pid, err)
		}
		if !gone {
			return fmt.Errorf("%w: slot %s: walsender pid %d did not exit within %v", ErrSlotInUse, slot, *pid, slotWait)
		}
	}
}

// checkSlotIsOurs returns ErrForeignSlot when a slot named slot exists
// but is not a pgoutput logical slot of conn's database: another
// database's changefeed may have picked the same name (serve's default),
// and taking that slot over or dropping it would end that changefeed.
func checkSlotIsOurs(ctx context.Context, conn *pgx.Conn, slot string) error {
	var db, kind, plugin *string
	var here string
	err := conn.QueryRow(ctx, `SELECT s.database, s.slot_type, s.plugin, current_database()
FROM pg_replication_slots s WHERE s.slot_name = $1`, slot).Scan(&db, &kind, &plugin, &here)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return nil
	case err != nil:
		return err
	case db == nil || *db != here || kind == nil || *kind != "logical" || plugin == nil || *plugin != "pgoutput":
		str := func(p *string) string {
			if p == nil {
				return "-"
			}
			return *p
		}
		return fmt.Errorf("%w: slot %s is a %s slot of database %s (plugin %s), not a pgoutput slot of %s: choose another slot name",
			ErrForeignSlot, slot, str(kind), str(db), str(plugin), here)
	}
	return nil
}

// SlotExists reports whether the source at dsn has the slot: a starting
// changefeed whose slot is missing clears what an earlier slot left in the
// target before Open creates a new one (serve's startOrResume).
func SlotExists(ctx context.Context, dsn, slot string) (bool, error) {
	conn, err := connect(ctx, dsn)
	if err != nil {
		return false, err
	}
	defer conn.Close(context.Background())
	if err := checkSlotIsOurs(ctx, conn, slot); err != nil {
		return false, err
	}
	var ok bool
	err = conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)", slot).Scan(&ok)
	return ok, err
}

// DropSlot drops the slot of the source at dsn if it exists (a changefeed
// starting over, which owns the slot: a walsender still attached to it is
// terminated first).
func DropSlot(ctx context.Context, dsn, slot string) error {
	conn, err := connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if err := checkSlotIsOurs(ctx, conn, slot); err != nil {
		return err
	}
	if err := releaseSlot(ctx, conn, slot, true, clock.Real{}); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1", slot)
	return err
}

// pubShape is what a publication publishes of a table (PostgreSQL 15):
// its column list (nil: every column) and its row filter ("" : every
// row). The initial snapshot and a copy read the same, as PostgreSQL's
// own table synchronisation does: a row the filter leaves out is not
// copied, a column the list leaves out not read.
type pubShape struct {
	attnames  []string
	rowFilter string
}

// pubShapeColumns is the select list of pg_publication_tables' column
// list and row filter: through to_jsonb, so that a server before 15
// (without those columns) answers NULL.
const pubShapeColumns = "to_jsonb(pt)->'attnames', coalesce(to_jsonb(pt)->>'rowfilter', '')"

// columns keeps the published ones of cols, in their order.
func (p pubShape) columns(cols []pgcodec.Column) []pgcodec.Column {
	if p.attnames == nil {
		return cols
	}
	out := make([]pgcodec.Column, 0, len(p.attnames))
	for _, c := range cols {
		if slices.Contains(p.attnames, c.Name) {
			out = append(out, c)
		}
	}
	return out
}

// publishedShape reads what publication pub publishes of rel; a table not
// (or no longer) in it is ErrTableGone.
func publishedShape(ctx context.Context, q pgx.Tx, pubs []string, rel pgcodec.Relation) (pubShape, error) {
	var p pubShape
	err := q.QueryRow(ctx, "SELECT "+pubShapeColumns+` FROM pg_publication_tables pt
WHERE pt.pubname = ANY($1) AND pt.schemaname = $2 AND pt.tablename = $3 LIMIT 1`, pubs, rel.Schema, rel.Name).Scan(&p.attnames, &p.rowFilter)
	if errors.Is(err, pgx.ErrNoRows) {
		return p, fmt.Errorf("%w: %s is no longer in publication %s", ErrTableGone, rel.QualifiedName(), strings.Join(pubs, ", "))
	}
	return p, err
}

// readScope is what a copy's query reads: FROM (the table, ONLY unless
// partitioned, as t) and the publication's row filter.
type readScope struct {
	from, filter string
}

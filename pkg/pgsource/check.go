package pgsource

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// ErrPrivilege: the source's role lacks a privilege the changefeed needs
// (REPLICATION, CREATE on the database, or what creating the publication
// takes).
var ErrPrivilege = errors.New("pgsource: the source role lacks a privilege")

// ErrNotPrimary: the source is a standby (in recovery): PostgreSQL 15
// decodes logical replication on a primary only.
var ErrNotPrimary = errors.New("pgsource: the source is a standby")

// Check runs every check Open can fail on, and changes nothing: the
// source answers and is a primary with wal_level logical; the role may
// replicate (REPLICATION, or a superuser); the publication exists, or the
// role may create it (FOR ALL TABLES: a superuser); every table it
// publishes, or would, has a key; the slot, if there is one, is a pgoutput
// slot of this database the server has not invalidated (ErrSlotLost). A
// start runs it before it creates or drops anything, on either database,
// so that a start that fails leaves both as it found them; Open runs it
// too.
func (s *Source) Check(ctx context.Context) error {
	conn, err := connect(ctx, s.opts.DSN)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return check(ctx, conn, s.opts.Publication, s.opts.Slot)
}

// CheckOn is Check on conn (a connection to the source), for publication
// pub and slot.
func CheckOn(ctx context.Context, conn *pgx.Conn, pub, slot string) error {
	return check(ctx, conn, pub, slot)
}

func check(ctx context.Context, conn *pgx.Conn, pub, slot string) error {
	if err := checkLogical(ctx, conn); err != nil {
		return err
	}
	var recovery, super, repl, pubExists bool
	var role string
	if err := conn.QueryRow(ctx, `SELECT pg_is_in_recovery(), r.rolsuper, r.rolreplication, r.rolname,
  EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)
FROM pg_roles r WHERE r.rolname = current_user`, pub).Scan(&recovery, &super, &repl, &role, &pubExists); err != nil {
		return fmt.Errorf("%w: read the role: %w", ErrConnect, err)
	}
	if recovery {
		return fmt.Errorf("%w: PostgreSQL 15 decodes logical replication on a primary only: point --source at the primary", ErrNotPrimary)
	}
	if !super && !repl {
		return fmt.Errorf("%w: role %q needs REPLICATION (ALTER ROLE %s REPLICATION) to stream the slot", ErrPrivilege, role, role)
	}
	if !pubExists && !super {
		return fmt.Errorf("%w: publication %s does not exist, and only a superuser may create it FOR ALL TABLES: "+
			"create it yourself (CREATE PUBLICATION %s FOR TABLE ...) or run as a superuser", ErrPrivilege, pub, pub)
	}
	tables, err := wouldPublish(ctx, conn, pub, pubExists)
	if err != nil {
		return err
	}
	for _, t := range tables {
		if t.relationErr != nil {
			return t.relationErr
		}
	}
	if err := checkSlotIsOurs(ctx, conn, slot); err != nil {
		return err
	}
	if st, err := ReadSlotStats(ctx, conn, slot); err != nil {
		return fmt.Errorf("%w: %w", ErrConnect, err)
	} else if st.WALStatus == "lost" {
		return slotLostError(slot)
	}
	return nil
}

// wouldPublish is what Open would find published: the publication's
// tables, or, for one Open would create FOR ALL TABLES, every table such a
// publication would publish (permanent tables and partitions outside the
// system schemas and the tool's).
func wouldPublish(ctx context.Context, conn *pgx.Conn, pub string, exists bool) ([]catalogTable, error) {
	if exists {
		return publishedTables(ctx, conn, pub)
	}
	// Published by a FOR ALL TABLES publication: pg_get_publication_tables'
	// rule (is_publishable_class) without creating one to ask it.
	rows, err := conn.Query(ctx, `
SELECT c.oid, n.nspname, c.relname, c.relreplident::text FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND c.relpersistence = 'p' AND c.oid >= 16384
  AND n.nspname NOT IN ('pg_catalog', 'information_schema', '`+ToolSchema+`') AND n.nspname NOT LIKE 'pg\_%'
ORDER BY n.nspname, c.relname`)
	if err != nil {
		return nil, err
	}
	var tables []catalogTable
	for rows.Next() {
		var t catalogTable
		var ident string
		if err := rows.Scan(&t.oid, &t.schema, &t.name, &ident); err != nil {
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
	cols, err := tablesColumns(ctx, conn, oids, idents)
	if err != nil {
		return nil, err
	}
	for i := range tables {
		t := &tables[i]
		t.columns = cols[t.oid]
		if err := t.relation().Validate(); err != nil {
			t.relationErr = fmt.Errorf("%w: %s.%s (replica identity %q): add a primary key, or set REPLICA IDENTITY USING INDEX: %w",
				ErrNoKey, t.schema, t.name, t.replIdent, err)
		}
	}
	return tables, nil
}

// TableInfo is a table of a publication as a changefeed reads it: Err
// says why it cannot be replicated (nil: it can).
type TableInfo struct {
	OID  uint32
	Name string
	Err  error
}

// ListTables lists the tables of publication pub the changefeed would
// read (the tool's schema left out), without changing anything.
func ListTables(ctx context.Context, conn *pgx.Conn, pub string) ([]TableInfo, error) {
	tables, err := publishedTables(ctx, conn, pub)
	if err != nil {
		return nil, err
	}
	out := make([]TableInfo, len(tables))
	for i, t := range tables {
		out[i] = TableInfo{OID: t.oid, Name: t.relation().QualifiedName(), Err: t.relationErr}
	}
	return out, nil
}

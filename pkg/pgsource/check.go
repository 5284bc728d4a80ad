package pgsource

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Check runs every check Open can fail on, and changes nothing: the
// source answers and is a primary with wal_level logical; the role may
// replicate (REPLICATION, or a superuser); the publication exists, or the
// role may create it (CREATE on the database: it lists the tables the
// role owns, publication.go); the slot, if there is one, is a pgoutput
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
	if !pubExists {
		var create bool
		if err := conn.QueryRow(ctx, "SELECT has_database_privilege(current_database(), 'CREATE')").Scan(&create); err != nil {
			return fmt.Errorf("%w: %w", ErrConnect, err)
		}
		if !create {
			return fmt.Errorf("%w: publication %s does not exist, and role %q may not create it (CREATE on the database): "+
				"GRANT CREATE ON DATABASE to it, or create the publication yourself (CREATE PUBLICATION %s FOR TABLE ...)", ErrPrivilege, pub, role, pub)
		}
	}
	if pubExists {
		// The snapshot and the copies read the tables: a table the role may
		// not read would fail the snapshot after the slot was made.
		var denied []string
		rows, err := conn.Query(ctx, `SELECT pt.schemaname || '.' || pt.tablename FROM pg_publication_tables pt
WHERE pt.pubname = $1 AND NOT has_table_privilege(format('%I.%I', pt.schemaname, pt.tablename), 'SELECT') ORDER BY 1 LIMIT 5`, pub)
		if err == nil {
			denied, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		if err != nil {
			return fmt.Errorf("%w: the publication's tables: %w", ErrConnect, err)
		}
		if len(denied) > 0 {
			return fmt.Errorf("%w: role %q may not read published tables (%s): GRANT SELECT on them", ErrPrivilege, role, strings.Join(denied, ", "))
		}
	}
	if err := checkSlotIsOurs(ctx, conn, slot); err != nil {
		return err
	}
	st, err := ReadSlotStats(ctx, conn, slot)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrConnect, err)
	}
	if st.WALStatus == "lost" {
		return slotLostError(slot)
	}
	// Room for what the start takes first: a slot (if it makes one) and a
	// walsender (the stream's; the catalog's and the side tasks' connect
	// again until they get one).
	var slots, maxSlots, senders, maxSenders int
	if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM pg_replication_slots), current_setting('max_replication_slots')::int,
  (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'walsender'), current_setting('max_wal_senders')::int`).
		Scan(&slots, &maxSlots, &senders, &maxSenders); err != nil {
		return fmt.Errorf("%w: %w", ErrConnect, err)
	}
	if !st.Exists && slots >= maxSlots {
		return fmt.Errorf("%w: every replication slot is taken (max_replication_slots = %d): raise it (a restart of the source) or drop an unused slot",
			ErrNoRoom, maxSlots)
	}
	if senders >= maxSenders {
		return fmt.Errorf("%w: every WAL sender is taken (max_wal_senders = %d; a changefeed uses 3): raise it (a restart of the source)",
			ErrNoRoom, maxSenders)
	}
	return nil
}

// TableInfo is a table of a publication as a changefeed reads it: Err
// says why it cannot be replicated (nil: it can).
type TableInfo struct {
	OID  uint32
	Name string
	Err  error
	// Identity is the table's pgcodec.Relation.Identity: IdentityNone,
	// only its inserts and truncates are streamed.
	Identity string
	// Columns are what the changefeed writes of each row, in order: the
	// published columns (a column list's), then the stored generated
	// ones the target computes (none under a column list).
	Columns []string
	// RowFilter is the publication's row filter of the table ("": none):
	// the source rows the target holds.
	RowFilter string
	// Key are its key columns (none for a keyless table).
	Key []string
}

// ListTables lists the tables of publication pub (and of its companion
// of inserts, if it has one) the changefeed would read (the tool's schema
// left out), without changing anything.
func ListTables(ctx context.Context, conn *pgx.Conn, pub string) ([]TableInfo, error) {
	pubs, err := publicationsOf(ctx, conn, pub)
	if err != nil {
		return nil, err
	}
	tables, err := publishedTables(ctx, conn, pubs)
	if err != nil {
		return nil, err
	}
	out := make([]TableInfo, len(tables))
	for i, t := range tables {
		rel := t.relation()
		out[i] = TableInfo{OID: t.oid, Name: rel.QualifiedName(), Err: t.relationErr, Identity: rel.Identity, RowFilter: t.pub.rowFilter,
			Key: rel.KeyColumns()}
		for _, c := range rel.Columns {
			out[i].Columns = append(out[i].Columns, c.Name)
		}
		for _, g := range rel.Generated {
			out[i].Columns = append(out[i].Columns, g.Name)
		}
	}
	return out, nil
}

// publicationsOf is pub and, if it exists, its companion of inserts.
func publicationsOf(ctx context.Context, conn *pgx.Conn, pub string) ([]string, error) {
	var has bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)", InsertsPublication(pub)).Scan(&has); err != nil {
		return nil, err
	}
	if has {
		return []string{pub, InsertsPublication(pub)}, nil
	}
	return []string{pub}, nil
}

package pgsource

import (
	"context"
	"fmt"
	"path"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// The publications a changefeed creates. FOR ALL TABLES publishing
// updates and deletes makes PostgreSQL refuse every UPDATE and DELETE of
// a table without a replica identity ("cannot update table ... because it
// does not have a replica identity and publishes updates"): a source
// write that succeeded before the changefeed started would fail after it.
// So a changefeed lists its tables (FOR TABLE), chosen by a rule (those
// matching TableRule's patterns that the role may publish), in two
// publications: the publication itself, which publishes every change,
// holds the tables whose updates and deletes the target can apply (a key,
// or REPLICA IDENTITY FULL: by the whole old row); its companion
// (InsertsPublication), which publishes only inserts and truncates, holds
// the others (the default identity or NOTHING without a key, pgbench's
// pgbench_history), whose updates and deletes the source keeps allowing
// and the changefeed cannot see (status names them). The tables the rule
// or the role leaves out are listed with why (LeftOut). The poll keeps
// both lists current (ManagePublication): a table created later is added
// (and copied, as any table that joins), one that gets or loses a key or
// FULL moves from one to the other in one transaction, before its updates
// would fail for long (within a poll interval: PostgreSQL checks at the
// UPDATE, not at the ALTER TABLE).

// InsertsPublication is the name of publication pub's companion that
// publishes only inserts and truncates (see above).
func InsertsPublication(pub string) string { return pub + "_inserts" }

// TableRule chooses the tables of a publication the changefeed manages:
// those whose "schema.table" matches an Include pattern and no Exclude
// pattern (path.Match globs: "public.*", "sales.order_*"; names as the
// catalog spells them, unquoted). An empty Include is every table.
type TableRule struct {
	Include, Exclude []string
}

// Validate checks the patterns.
func (r TableRule) Validate() error {
	for _, p := range append(append([]string(nil), r.Include...), r.Exclude...) {
		if p == "" || !strings.Contains(p, ".") {
			return fmt.Errorf("%w: %q: want schema.table, globs allowed (public.*)", ErrBadPattern, p)
		}
		if _, err := path.Match(p, "x.y"); err != nil {
			return fmt.Errorf("%w: %q: %w", ErrBadPattern, p, err)
		}
	}
	return nil
}

// Matches reports whether the rule's patterns take schema.name.
func (r TableRule) Matches(schema, name string) bool {
	full := schema + "." + name
	match := func(ps []string) bool {
		for _, p := range ps {
			if ok, _ := path.Match(p, full); ok {
				return true
			}
		}
		return false
	}
	return (len(r.Include) == 0 || match(r.Include)) && !match(r.Exclude)
}

// candidate is a table a managed publication could list: a plain table
// or the root of a partitioned one (whose partitions it then publishes,
// each as a table).
type candidate struct {
	oid          uint32
	schema, name string
	replIdent    byte
	keyed        bool // a primary key, or the replica identity's index
	owned        bool // the role may publish it (owner, or superuser)
}

// whole reports whether the target can apply the candidate's updates and
// deletes: it goes into the publication that publishes them.
func (c candidate) whole() bool { return c.keyed || c.replIdent == 'f' }

// LeftOut is a table the changefeed does not replicate, with why.
type LeftOut struct {
	Table  string
	Reason string
}

// selectTables splits the candidates into the tables of the publication
// (whole), those of its companion (inserts only) and those left out, by
// name.
func selectTables(cands []candidate, r TableRule) (whole, inserts []candidate, left []LeftOut) {
	for _, c := range cands {
		name := c.schema + "." + c.name
		switch {
		case !r.Matches(c.schema, c.name):
			continue // not the changefeed's: nothing to say
		case !c.owned:
			left = append(left, LeftOut{Table: name, Reason: "the source role does not own it, so it may not add it to the publication " +
				"(a superuser, or its owner, can: ALTER PUBLICATION ... ADD TABLE)"})
		case c.whole():
			whole = append(whole, c)
		default:
			inserts = append(inserts, c)
		}
	}
	sort.Slice(left, func(i, j int) bool { return left[i].Table < left[j].Table })
	return whole, inserts, left
}

// candidates lists the tables a managed publication could hold.
func candidates(ctx context.Context, conn *pgx.Conn) ([]candidate, error) {
	rows, err := conn.Query(ctx, `
SELECT c.oid, n.nspname, c.relname, c.relreplident::text,
  EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND
          CASE WHEN c.relreplident = 'i' THEN i.indisreplident WHEN c.relreplident = 'n' THEN false ELSE i.indisprimary END),
  (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) OR pg_has_role(c.relowner, 'USAGE')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND c.relpersistence = 'p' AND NOT c.relispartition AND c.oid >= 16384
  AND n.nspname NOT IN ('pg_catalog', 'information_schema', '`+ToolSchema+`') AND n.nspname NOT LIKE 'pg\_%'
ORDER BY n.nspname, c.relname`)
	if err != nil {
		return nil, fmt.Errorf("%w: list the tables: %w", ErrConnect, err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (candidate, error) {
		var c candidate
		var ident string
		err := r.Scan(&c.oid, &c.schema, &c.name, &ident, &c.keyed, &c.owned)
		if ident != "" {
			c.replIdent = ident[0]
		}
		return c, err
	})
}

// quoted is a candidate's name for SQL.
func (c candidate) quoted() string { return pgx.Identifier{c.schema, c.name}.Sanitize() }

// createPublication creates the publication and its companion listing
// the tables rule chooses, and returns those it left out.
func createPublication(ctx context.Context, conn *pgx.Conn, name string, rule TableRule) ([]LeftOut, error) {
	cands, err := candidates(ctx, conn)
	if err != nil {
		return nil, err
	}
	whole, inserts, left := selectTables(cands, rule)
	list := func(cs []candidate) string {
		if len(cs) == 0 {
			return ""
		}
		names := make([]string, len(cs))
		for i, c := range cs {
			names[i] = c.quoted()
		}
		return " FOR TABLE " + strings.Join(names, ", ")
	}
	stmt := "BEGIN; CREATE PUBLICATION " + pgx.Identifier{name}.Sanitize() + list(whole) + "; CREATE PUBLICATION " +
		pgx.Identifier{InsertsPublication(name)}.Sanitize() + list(inserts) + " WITH (publish = 'insert, truncate'); COMMIT"
	if _, err := conn.Exec(ctx, stmt); err != nil {
		return nil, fmt.Errorf("create publication %s: %w", name, err)
	}
	return left, nil
}

// syncPublication brings a managed publication's lists to what the rule
// chooses now: tables to add (created, now matching), to move between
// the publication and its companion (a key or FULL got or lost: in one
// transaction, so the table is never out of both) and to take out (no
// longer matching). It creates the companion of a publication made by an
// earlier version. It returns what it left out.
func (s *Source) syncPublication(ctx context.Context, conn *pgx.Conn) ([]LeftOut, error) {
	cands, err := candidates(ctx, conn)
	if err != nil {
		return nil, err
	}
	whole, inserts, left := selectTables(cands, s.opts.Tables)
	main, companion := s.opts.Publication, InsertsPublication(s.opts.Publication)
	var hasCompanion bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)", companion).Scan(&hasCompanion); err != nil {
		return nil, err
	}
	if !hasCompanion {
		if _, err := conn.Exec(ctx, "CREATE PUBLICATION "+pgx.Identifier{companion}.Sanitize()+" WITH (publish = 'insert, truncate')"); err != nil {
			return nil, fmt.Errorf("create publication %s: %w", companion, err)
		}
	}
	rows, err := conn.Query(ctx, `SELECT pr.prrelid, p.pubname FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid
WHERE p.pubname = ANY($1)`, []string{main, companion})
	if err != nil {
		return nil, err
	}
	in := map[uint32]string{} // table -> the publication that lists it
	for rows.Next() {
		var oid uint32
		var pub string
		if err := rows.Scan(&oid, &pub); err != nil {
			rows.Close()
			return nil, err
		}
		in[oid] = pub
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	want := map[uint32]string{}
	for _, c := range whole {
		want[c.oid] = main
	}
	for _, c := range inserts {
		want[c.oid] = companion
	}
	for _, c := range cands {
		have, to := in[c.oid], want[c.oid]
		if have == to {
			continue
		}
		var stmts []string
		if have != "" {
			stmts = append(stmts, "ALTER PUBLICATION "+pgx.Identifier{have}.Sanitize()+" DROP TABLE "+c.quoted())
		}
		if to != "" {
			stmts = append(stmts, "ALTER PUBLICATION "+pgx.Identifier{to}.Sanitize()+" ADD TABLE "+c.quoted())
		}
		table := c.schema + "." + c.name
		if _, err := conn.Exec(ctx, "BEGIN; "+strings.Join(stmts, "; ")+"; COMMIT"); err != nil {
			s.log.Warn("a table's place in the changefeed's publications could not be changed", zap.String("table", table),
				zap.String("from", have), zap.String("to", to), zap.Error(err))
			continue
		}
		switch {
		case have == "":
			s.log.Info("added a table to the publication", zap.String("table", table), zap.String("publication", to))
		case to == "":
			s.log.Warn("took a table out of the publication: it no longer matches --include/--exclude, or the role may no longer publish it",
				zap.String("table", table))
		case to == companion:
			s.log.Warn("a table lost its key: only its inserts are replicated from now (its UPDATE and DELETE would fail on the source "+
				"under a publication of them); add a key or REPLICA IDENTITY FULL", zap.String("table", table))
		default:
			s.log.Info("a table got a key or REPLICA IDENTITY FULL: its updates and deletes are replicated from now", zap.String("table", table))
		}
	}
	return left, nil
}

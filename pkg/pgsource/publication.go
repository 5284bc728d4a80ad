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

// The publication a changefeed creates. FOR ALL TABLES publishing updates
// and deletes makes PostgreSQL refuse every UPDATE and DELETE of a table
// without a replica identity ("cannot update table ... because it does
// not have a replica identity and publishes updates"): a source write that
// succeeded before the changefeed started would fail after it. So the
// publication a changefeed creates lists its tables (FOR TABLE), chosen by
// a rule: those matching TableRule's patterns that have a key the target
// can apply updates and deletes by and that the role may publish. The
// others are left out, each with why (LeftOut), and their writes are the
// source's as before. The poll keeps the list current (ManagePublication):
// a table created or given a key later is added (and copied, as any table
// that joins), one that loses its key is taken out before its updates
// would fail for long (within a poll interval: PostgreSQL checks at the
// UPDATE, not at the ALTER TABLE).

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

// LeftOut is a table the changefeed does not replicate, with why.
type LeftOut struct {
	Table  string
	Reason string
}

// selectTables splits the candidates into the tables to publish and
// those left out, by name.
func selectTables(cands []candidate, r TableRule) (publish []candidate, left []LeftOut) {
	for _, c := range cands {
		name := c.schema + "." + c.name
		switch {
		case !r.Matches(c.schema, c.name):
			continue // not the changefeed's: nothing to say
		case !c.keyed:
			ident := "default"
			switch c.replIdent {
			case 'n':
				ident = "nothing"
			case 'f':
				ident = "full"
			}
			left = append(left, LeftOut{Table: name, Reason: fmt.Sprintf("no primary key or replica identity index (replica identity %s): "+
				"a publication that publishes its updates would make PostgreSQL refuse them; add a primary key, or "+
				"ALTER TABLE ... REPLICA IDENTITY USING INDEX, and it joins at the next poll", ident)})
		case !c.owned:
			left = append(left, LeftOut{Table: name, Reason: "the source role does not own it, so it may not add it to the publication " +
				"(a superuser, or its owner, can: ALTER PUBLICATION ... ADD TABLE)"})
		default:
			publish = append(publish, c)
		}
	}
	sort.Slice(left, func(i, j int) bool { return left[i].Table < left[j].Table })
	return publish, left
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

// createPublication creates the publication listing the tables rule
// chooses, and returns those it left out.
func createPublication(ctx context.Context, conn *pgx.Conn, name string, rule TableRule) ([]LeftOut, error) {
	cands, err := candidates(ctx, conn)
	if err != nil {
		return nil, err
	}
	publish, left := selectTables(cands, rule)
	stmt := "CREATE PUBLICATION " + pgx.Identifier{name}.Sanitize()
	if len(publish) > 0 {
		names := make([]string, len(publish))
		for i, c := range publish {
			names[i] = c.quoted()
		}
		stmt += " FOR TABLE " + strings.Join(names, ", ")
	}
	if _, err := conn.Exec(ctx, stmt); err != nil {
		return nil, fmt.Errorf("create publication %s: %w", name, err)
	}
	return left, nil
}

// syncPublication brings a managed publication's list to what the rule
// chooses now: tables to add (created, given a key, now matching) and
// tables to take out (a key lost: their updates would fail on the
// source; no longer matching). It returns what it left out.
func (s *Source) syncPublication(ctx context.Context, conn *pgx.Conn) ([]LeftOut, error) {
	cands, err := candidates(ctx, conn)
	if err != nil {
		return nil, err
	}
	publish, left := selectTables(cands, s.opts.Tables)
	rows, err := conn.Query(ctx, `SELECT pr.prrelid FROM pg_publication_rel pr JOIN pg_publication p ON p.oid = pr.prpubid
WHERE p.pubname = $1`, s.opts.Publication)
	if err != nil {
		return nil, err
	}
	members, err := pgx.CollectRows(rows, pgx.RowTo[uint32])
	if err != nil {
		return nil, err
	}
	in := make(map[uint32]bool, len(members))
	for _, oid := range members {
		in[oid] = true
	}
	want := make(map[uint32]bool, len(publish))
	pub := pgx.Identifier{s.opts.Publication}.Sanitize()
	for _, c := range publish {
		want[c.oid] = true
		if in[c.oid] {
			continue
		}
		if _, err := conn.Exec(ctx, "ALTER PUBLICATION "+pub+" ADD TABLE "+c.quoted()); err != nil {
			s.log.Warn("a table the changefeed takes could not be added to its publication", zap.String("table", c.schema+"."+c.name), zap.Error(err))
			continue
		}
		s.log.Info("added a table to the publication", zap.String("table", c.schema+"."+c.name))
	}
	for _, c := range cands {
		if !in[c.oid] || want[c.oid] {
			continue
		}
		if _, err := conn.Exec(ctx, "ALTER PUBLICATION "+pub+" DROP TABLE "+c.quoted()); err != nil {
			s.log.Warn("a table the changefeed no longer takes could not be taken out of its publication", zap.String("table", c.schema+"."+c.name), zap.Error(err))
			continue
		}
		s.log.Warn("took a table out of the publication: it no longer has a key (its UPDATE and DELETE would fail on the source) "+
			"or no longer matches --include/--exclude", zap.String("table", c.schema+"."+c.name))
	}
	return left, nil
}

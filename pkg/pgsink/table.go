package pgsink

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// table is a target table as a lane knows it: its columns' SQL types
// (from the target's catalog, for the casts of the text values) and its
// key. It belongs to the one lane that applies it.
type table struct {
	rel   pgcodec.Relation // the source's latest description
	qname string
	types map[string]string // column -> SQL type, in the target
	order []string          // the target's columns, in order
	key   []string
	// required are the target's columns no row can be written without
	// (NOT NULL, no default, not generated or identity); own those the
	// target table has of its own (own.go), never the source's.
	required map[string]bool
	own      map[string]bool
	// defaults are the target columns' default expressions ("" none);
	// fixed those it cannot be given a value (generated, identity
	// ALWAYS).
	defaults map[string]string
	fixed    map[string]bool
	// stmts caches the statements built from types and key, by the
	// upserted columns' signature (deleteSig for the delete), so they are
	// built once, not per commit. Cleared when a column is added or the
	// table reloaded.
	stmts map[string]*stmt
	// last is the statement each form (forms) last used, with the
	// columns it writes: at 1000 tables most statements are a table's one
	// upsert of one row, which this finds without building the signature
	// string and probing stmts.
	last [2][forms]lastStmt // [1]: the deletes
}

// The forms a table's statements take: an upsert or delete of one row, of
// two (VALUES) and of more (unnested arrays).
const (
	formOne = iota
	formTwo
	formMany
	forms
)

// The forms follow valuesMaxRows: two VALUES forms, then the unnested
// one (this fails to compile if valuesMaxRows changes without them).
var _ = [1]struct{}{}[forms-(valuesMaxRows+1)]

func formOf(rows int) int { return min(rows, formMany+1) - 1 }

// lastStmt is a form's last statement: its columns (nil: a delete) and
// itself.
type lastStmt struct {
	cols []string
	st   *stmt
}

// forget drops the statements built from the table's columns and key
// (they changed).
func (t *table) forget() {
	t.stmts, t.last = nil, [2][forms]lastStmt{}
}

// memo returns the statement of form that writes cols (or, with del,
// deletes by key), built by build on a miss of the form's last one.
func (t *table) memo(form int, del bool, cols []string, build func() *stmt) *stmt {
	l := &t.last[0][form]
	if del {
		l = &t.last[1][form]
	}
	if l.st != nil && slices.Equal(l.cols, cols) {
		return l.st
	}
	*l = lastStmt{cols: cols, st: build()}
	return l.st
}

// deleteSig is the stmts key of the delete: it starts with a NUL, which no
// column signature does (names are never empty and hold no NUL).
const deleteSig = "\x00delete"

// statement returns the cached statement of sig, built by build if new.
func (t *table) statement(sig string, build func() string) *stmt {
	if s, ok := t.stmts[sig]; ok {
		return s
	}
	if t.stmts == nil {
		t.stmts = map[string]*stmt{}
	}
	s := &stmt{sql: build()}
	t.stmts[sig] = s
	return s
}

// loadTables reads the target tables' columns and keys, in one query.
func loadTables(ctx context.Context, q querier, rels []pgcodec.Relation) (map[uint32]*table, error) {
	byName := map[[2]string]*table{}
	names := make([]string, len(rels))
	out := map[uint32]*table{}
	for i, r := range rels {
		t := &table{rel: r, qname: r.QualifiedName(), types: map[string]string{}, required: map[string]bool{},
			defaults: map[string]string{}, fixed: map[string]bool{}}
		byName[[2]string{r.Schema, r.Name}] = t
		out[r.OID] = t
		names[i] = t.qname
	}
	rows, err := q.Query(ctx, `
SELECT n.nspname, c.relname, a.attname, format_type(a.atttypid, a.atttypmod), coalesce(a.attnum = ANY(k.indkey), false),
  a.attnotnull AND NOT a.atthasdef AND a.attidentity = '' AND a.attgenerated = '',
  coalesce(pg_get_expr(d.adbin, d.adrelid), ''), a.attgenerated <> '' OR a.attidentity = 'a'
FROM pg_attribute a
LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
JOIN pg_class c ON c.oid = a.attrelid
JOIN pg_namespace n ON n.oid = c.relnamespace
LEFT JOIN LATERAL (SELECT i.indkey FROM pg_index i WHERE i.indrelid = a.attrelid AND i.indisprimary) k ON true
WHERE a.attrelid = ANY($1::text[]::regclass[]) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attrelid, a.attnum`, names)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var schema, rel, name, typ, def string
		var key, required, fixed bool
		if err := rows.Scan(&schema, &rel, &name, &typ, &key, &required, &def, &fixed); err != nil {
			return nil, err
		}
		t := byName[[2]string{schema, rel}]
		if t == nil {
			continue
		}
		t.types[name] = typ
		t.order = append(t.order, name)
		t.required[name] = required
		t.defaults[name], t.fixed[name] = def, fixed
		if key {
			t.key = append(t.key, name)
		}
	}
	return out, rows.Err()
}

// querier is a connection or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// targetTypes is the set of a relation's created types (a column's Type
// where it has a Base) that the target has too (to_regtype), read when
// its tables are created or get columns.
type targetTypes map[string]bool

// of is the type a column is created with in the target: a created type
// the target has (an extension's, an enum the user made there) as
// itself, else its base type.
func (h targetTypes) of(c pgcodec.Column) string {
	if c.Base != "" && h[c.Type] {
		return c.Type
	}
	return c.TargetType()
}

// missingTables is the set of the qualified names of rels that the target
// lacks.
func missingTables(ctx context.Context, q querier, rels []pgcodec.Relation) (map[string]bool, error) {
	if len(rels) == 0 {
		return nil, nil
	}
	names := make([]string, len(rels))
	for i, r := range rels {
		names[i] = r.QualifiedName()
	}
	return nameSet(ctx, q, "SELECT n FROM unnest($1::text[]) AS n WHERE to_regclass(n) IS NULL", names)
}

// nameSet runs sql, a query of one text column over the array names, and
// returns the names it yields as a set.
func nameSet(ctx context.Context, q querier, sql string, names []string) (map[string]bool, error) {
	rows, err := q.Query(ctx, sql, names)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	set := map[string]bool{}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return nil, err
		}
		set[n] = true
	}
	return set, rows.Err()
}

// createTableSQL creates rel's schema and table if missing, with its
// columns and key.
func createTableSQL(rel pgcodec.Relation, has targetTypes) string {
	cols := make([]string, len(rel.Columns), len(rel.Columns)+len(rel.Generated)+1)
	for i, c := range rel.Columns {
		cols[i] = pgcodec.QuoteIdent(c.Name) + " " + has.of(c)
	}
	for _, g := range rel.Generated {
		// The source's expression (validated: it cannot leave its
		// parentheses); the target computes the values, which PostgreSQL
		// 15 does not publish.
		cols = append(cols, fmt.Sprintf("%s %s GENERATED ALWAYS AS (%s) STORED", pgcodec.QuoteIdent(g.Name), g.Type, g.Expr))
	}
	keys := make([]string, 0, 2)
	for _, k := range rel.KeyColumns() {
		keys = append(keys, pgcodec.QuoteIdent(k))
	}
	if len(keys) > 0 {
		cols = append(cols, "PRIMARY KEY ("+strings.Join(keys, ", ")+")")
	} // a keyless table (keyless.go) has none, and maybe no columns either
	return fmt.Sprintf("CREATE SCHEMA IF NOT EXISTS %s; CREATE TABLE IF NOT EXISTS %s (%s)",
		pgcodec.QuoteIdent(rel.Schema), rel.QualifiedName(), strings.Join(cols, ", "))
}

// addColumnSQL adds c to table qname. A column the source added with a
// constant default holds it in the rows that were there (PostgreSQL keeps
// it aside, and no row change carries it), so the target's rows get it
// too: added with that value as its default, which is then dropped, since
// the target's columns take every value from the source.
func addColumnSQL(qname string, c pgcodec.Column, typ string) []string {
	col := pgcodec.QuoteIdent(c.Name)
	if !c.HasMissing {
		return []string{fmt.Sprintf("ALTER TABLE %s ADD COLUMN IF NOT EXISTS %s %s", qname, col, typ)}
	}
	return []string{
		fmt.Sprintf("ALTER TABLE %s ADD COLUMN IF NOT EXISTS %s %s DEFAULT %s::%s", qname, col, typ,
			pgcodec.QuoteLiteral(c.Missing), typ),
		fmt.Sprintf("ALTER TABLE %s ALTER COLUMN %s DROP DEFAULT", qname, col),
	}
}

// deleteSQL deletes the keys given as one text array per key column.
func (t *table) deleteSQL() string {
	arrays := make([]string, len(t.key))
	cond := make([]string, len(t.key))
	for i, k := range t.key {
		q := pgcodec.QuoteIdent(k)
		arrays[i] = fmt.Sprintf("$%d::text[]", i+1)
		cond[i] = fmt.Sprintf("t.%s = k.%s::%s", q, q, t.types[k])
	}
	return fmt.Sprintf("DELETE FROM %s AS t USING unnest(%s) AS k(%s) WHERE %s", t.qname, strings.Join(arrays, ", "),
		quoteAll(t.key), strings.Join(cond, " AND "))
}

// deleteValuesSQL deletes n keys given as text parameters, key by key
// (see valuesMaxRows).
func (t *table) deleteValuesSQL(n int) string {
	return fmt.Sprintf("DELETE FROM %s WHERE (%s) IN (%s)", t.qname, quoteAll(t.key), t.valueRows(t.key, n))
}

// upsertSQL inserts rows of cols (text arrays, one per column), updating
// the non-key columns of cols on a key conflict: a column absent from
// cols (a TOASTed value left unchanged) keeps its value.
func (t *table) upsertSQL(cols []string) string {
	arrays := make([]string, len(cols))
	casts := make([]string, len(cols))
	for i, c := range cols {
		q := pgcodec.QuoteIdent(c)
		arrays[i] = fmt.Sprintf("$%d::text[]", i+1)
		casts[i] = fmt.Sprintf("u.%s::%s", q, t.types[c])
	}
	return fmt.Sprintf("INSERT INTO %s (%s) SELECT %s FROM unnest(%s) AS u(%s) %s", t.qname, quoteAll(cols),
		strings.Join(casts, ", "), strings.Join(arrays, ", "), quoteAll(cols), t.onConflict(cols))
}

// upsertValuesSQL is upsertSQL for n rows given as text parameters, row
// by row (see valuesMaxRows).
func (t *table) upsertValuesSQL(cols []string, n int) string {
	return fmt.Sprintf("INSERT INTO %s (%s) VALUES %s %s", t.qname, quoteAll(cols), t.valueRows(cols, n), t.onConflict(cols))
}

// moveSQL inserts a row of the present columns (text parameters, in
// order), its unchanged columns copied from the row at the old key (the
// key columns' text parameters after them), or NULL when the target has
// no row there, upserting like upsertSQL.
func (t *table) moveSQL(present, unchanged []string) string {
	sel := make([]string, 0, len(present)+len(unchanged))
	p := 0
	for _, c := range present {
		p++
		sel = append(sel, fmt.Sprintf("$%d::text::%s", p, t.types[c]))
	}
	for _, c := range unchanged {
		sel = append(sel, "o."+pgcodec.QuoteIdent(c))
	}
	on := make([]string, len(t.key))
	for i, k := range t.key {
		p++
		on[i] = fmt.Sprintf("o.%s = $%d::text::%s", pgcodec.QuoteIdent(k), p, t.types[k])
	}
	cols := append(slices.Clone(present), unchanged...)
	// The target's own columns go with the row too (their default where
	// the old row is not there).
	for _, c := range t.order {
		if !t.own[c] || t.fixed[c] {
			continue
		}
		v := "o." + pgcodec.QuoteIdent(c)
		if d := t.defaults[c]; d != "" {
			v = "coalesce(" + v + ", " + d + ")"
		}
		sel, cols = append(sel, v), append(cols, c)
	}
	return fmt.Sprintf("INSERT INTO %s (%s) SELECT %s FROM (VALUES (1)) AS x LEFT JOIN %s AS o ON %s %s", t.qname, quoteAll(cols),
		strings.Join(sel, ", "), t.qname, strings.Join(on, " AND "), t.onConflict(cols))
}

// valueRows lists n rows of cols as text parameters cast to the columns'
// types: ($1::text::bigint, $2::text::text), ($3::text::bigint, ...).
func (t *table) valueRows(cols []string, n int) string {
	var b strings.Builder
	p := 0
	for r := range n {
		if r > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('(')
		for i, c := range cols {
			if i > 0 {
				b.WriteString(", ")
			}
			p++
			fmt.Fprintf(&b, "$%d::text::%s", p, t.types[c])
		}
		b.WriteByte(')')
	}
	return b.String()
}

// onConflict updates the non-key columns of cols on a key conflict (or
// does nothing if cols are all key columns).
func (t *table) onConflict(cols []string) string {
	var set []string
	for _, c := range cols {
		if !slices.Contains(t.key, c) {
			q := pgcodec.QuoteIdent(c)
			set = append(set, fmt.Sprintf("%s = EXCLUDED.%s", q, q))
		}
	}
	if len(set) == 0 {
		return fmt.Sprintf("ON CONFLICT (%s) DO NOTHING", quoteAll(t.key))
	}
	return fmt.Sprintf("ON CONFLICT (%s) DO UPDATE SET %s", quoteAll(t.key), strings.Join(set, ", "))
}

func quoteAll(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = pgcodec.QuoteIdent(n)
	}
	return strings.Join(q, ", ")
}

// createdTypes returns which of rels' created types (the Type of a
// column with a Base) the target has, by name as the source formats it.
func createdTypes(ctx context.Context, q querier, rels ...pgcodec.Relation) (targetTypes, error) {
	var names []string
	for _, r := range rels {
		for _, c := range r.Columns {
			if c.Base != "" && !slices.Contains(names, c.Type) {
				names = append(names, c.Type)
			}
		}
	}
	if len(names) == 0 {
		return targetTypes{}, nil
	}
	set, err := nameSet(ctx, q, "SELECT n FROM unnest($1::text[]) AS n WHERE to_regtype(n) IS NOT NULL", names)
	return targetTypes(set), err
}

package pgsink

import (
	"fmt"
	"maps"
	"slices"

	"github.com/cdcflow/eventservice/pkg/pgcodec"
)

// Schema changes carried to the target. A relation version (a DDL of the
// stream, at the commit-ts just below the first row that uses it) is
// compared with the version the table was last written by, and the
// target is changed to match, in the lane's transaction, before the rows
// that need it and after the rows of the old shape:
//
//   - the table renamed or moved to another schema (the same source table,
//     its OID): ALTER TABLE ... RENAME TO, SET SCHEMA;
//   - a column renamed: by its column number (pgcodec.Column.Num) when both
//     versions carry them, else only when the one name gone and the one
//     name new sit at the same place with the same type and it is not the
//     last column (a drop of the last column and an add of another would
//     look the same: that is refused, naming why);
//   - a column dropped (gone, and no name new): DROP COLUMN;
//   - a column added: ADD COLUMN (with the value the rows that were there
//     hold, as before);
//   - a column's type changed: ALTER COLUMN ... TYPE, converting the
//     target's values by the new type's cast;
//   - the key changed: the primary key dropped and added again (a table
//     that gets a key with duplicate rows is refused by the target, and
//     stops).
//
// Anything else stops the table (ErrSchemaChange), as before: a column of
// the target's own taken by the source, a rename the versions cannot
// tell from a drop and an add.

// evolve compares rel, a new version of the table's source relation, with
// the one the table was last written by, and returns the statements that
// change the target to match (ErrSchemaChange for what it cannot). A
// column of a created type matches a target column of that type (a table
// the user created first) or of its base type (one this sink created).
func (t *table) evolve(rel pgcodec.Relation, has targetTypes) ([]string, error) {
	var stmts []string
	qname := t.qname
	old := t.rel
	if old.Name != "" && (old.Schema != rel.Schema || old.Name != rel.Name) {
		if old.Schema != rel.Schema {
			stmts = append(stmts, "CREATE SCHEMA IF NOT EXISTS "+pgcodec.QuoteIdent(rel.Schema),
				fmt.Sprintf("ALTER TABLE %s SET SCHEMA %s", qname, pgcodec.QuoteIdent(rel.Schema)))
			qname = pgcodec.QuoteIdent(rel.Schema) + "." + pgcodec.QuoteIdent(old.Name)
		}
		if old.Name != rel.Name {
			stmts = append(stmts, fmt.Sprintf("ALTER TABLE %s RENAME TO %s", qname, pgcodec.QuoteIdent(rel.Name)))
		}
		qname = rel.QualifiedName()
	}
	inRel := map[string]bool{}
	for _, g := range rel.Generated {
		inRel[g.Name] = true // the target computes it
	}
	for _, c := range rel.Columns {
		inRel[c.Name] = true
	}
	renames, err := t.renames(old, rel, qname)
	if err != nil {
		return nil, err
	}
	renamed := map[string]string{} // new name -> old
	if len(renames) > 1 {
		// Through names of their own first: one may take another's
		// (a and b swapped).
		for k, r := range renames {
			stmts = append(stmts, fmt.Sprintf("ALTER TABLE %s RENAME COLUMN %s TO %s", qname, pgcodec.QuoteIdent(r[0]),
				pgcodec.QuoteIdent(fmt.Sprintf("cdcflow_renaming_%d", k))))
			renames[k][0] = fmt.Sprintf("cdcflow_renaming_%d", k)
		}
	}
	for _, r := range renames {
		stmts = append(stmts, fmt.Sprintf("ALTER TABLE %s RENAME COLUMN %s TO %s", qname, pgcodec.QuoteIdent(r[0]), pgcodec.QuoteIdent(r[1])))
	}
	renames, _ = t.renames(old, rel, qname) // the names the target had, for the state below
	for _, r := range renames {
		renamed[r[1]] = r[0]
	}
	// A column dropped and added again under its name: its number
	// changed (known only by the capture's numbers).
	replaced := map[string]bool{}
	if numbered(old) && numbered(rel) {
		for _, c := range rel.Columns {
			if k := slices.IndexFunc(old.Columns, func(o pgcodec.Column) bool { return o.Name == c.Name }); k >= 0 && old.Columns[k].Num != c.Num {
				if _, ok := renamed[c.Name]; !ok && !slices.ContainsFunc(renames, func(r [2]string) bool { return r[0] == c.Name }) {
					replaced[c.Name] = true
				}
			}
		}
	}
	// Generated columns the source dropped, before the columns they read
	// (a DROP COLUMN ... CASCADE at the source dropped both).
	for _, g := range old.Generated {
		if !slices.ContainsFunc(rel.Generated, func(n pgcodec.GeneratedColumn) bool { return n.Name == g.Name }) {
			stmts = append(stmts, fmt.Sprintf("ALTER TABLE %s DROP COLUMN IF EXISTS %s", qname, pgcodec.QuoteIdent(g.Name)))
		}
	}
	for _, name := range t.order {
		if replaced[name] {
			stmts = append(stmts, fmt.Sprintf("ALTER TABLE %s DROP COLUMN IF EXISTS %s", qname, pgcodec.QuoteIdent(name)))
			continue
		}
		if inRel[name] || t.own[name] || slices.ContainsFunc(renames, func(r [2]string) bool { return r[0] == name }) ||
			slices.ContainsFunc(old.Generated, func(g pgcodec.GeneratedColumn) bool { return g.Name == name }) {
			continue // (a generated column gone: below)
		}
		if !slices.ContainsFunc(old.Columns, func(c pgcodec.Column) bool { return c.Name == name }) {
			return nil, fmt.Errorf("%w: %s: column %q is not the source's, and was added to the target table after the changefeed first "+
				"wrote to it (a column of its own is one it had then)", ErrSchemaChange, qname, name)
		}
		stmts = append(stmts, fmt.Sprintf("ALTER TABLE %s DROP COLUMN IF EXISTS %s", qname, pgcodec.QuoteIdent(name)))
	}
	for _, c := range rel.Columns {
		name := c.Name
		if was, ok := renamed[name]; ok {
			name = was
		}
		typ, ok := t.types[name]
		switch {
		case replaced[c.Name]:
			stmts = append(stmts, addColumnSQL(qname, c, has.of(c))...)
		case t.own[c.Name]:
			// The user's column: writing the source's values into it
			// would overwrite theirs.
			return nil, fmt.Errorf("%w: %s: the source has a column %q now, and the target table has one of its own by that name",
				ErrSchemaChange, qname, c.Name)
		case !ok:
			stmts = append(stmts, addColumnSQL(qname, c, has.of(c))...)
		case typ != c.Type && (c.Base == "" || typ != c.Base) && retyped(old, name, c):
			// The source's type changed (a target column of another type
			// the user created first, which holds the values, is theirs).
			if rel.UnknownConversion != "" {
				return nil, fmt.Errorf("%w: %s: column %q became %s by a statement that may convert its values by an expression of its own "+
					"(USING), which cannot be known here; a cast could give values other than the source's. Apply it to the target "+
					"table by hand, then restart serve (the table goes on from its checkpoint). The statement: %s",
					ErrSchemaChange, qname, c.Name, c.Type, rel.UnknownConversion)
			}
			to := has.of(c)
			stmts = append(stmts, fmt.Sprintf("ALTER TABLE %s ALTER COLUMN %s TYPE %s USING %s::%s", qname,
				pgcodec.QuoteIdent(c.Name), to, pgcodec.QuoteIdent(c.Name), to))
		}
	}
	// Stored generated columns the source added or dropped (a version of
	// the DDL capture's: the stream has no other word of them). The
	// target computes an added one for the rows it holds.
	for _, g := range rel.Generated {
		if _, ok := t.types[g.Name]; !ok && !t.own[g.Name] {
			stmts = append(stmts, generatedColumnSQL(qname, g))
		}
	}
	if key := rel.KeyColumns(); !slices.Equal(key, t.keyAfter(renamed)) {
		if len(t.key) > 0 {
			stmts = append(stmts, dropPrimaryKeySQL(qname))
		}
		if len(key) > 0 {
			stmts = append(stmts, fmt.Sprintf("ALTER TABLE %s ADD PRIMARY KEY (%s)", qname, quoteAll(key)))
		}
	}
	return stmts, nil
}

// generatedColumnSQL adds generated column g to table qname (its
// expression validated by pgcodec.Relation.Validate).
func generatedColumnSQL(qname string, g pgcodec.GeneratedColumn) string {
	return fmt.Sprintf("ALTER TABLE %s ADD COLUMN IF NOT EXISTS %s %s GENERATED ALWAYS AS (%s) STORED", qname, pgcodec.QuoteIdent(g.Name), g.Type, g.Expr)
}

// keyAfter is the target's key with renamed columns (new -> old) under
// their new names.
func (t *table) keyAfter(renamed map[string]string) []string {
	out := slices.Clone(t.key)
	for i, k := range out {
		for n, o := range renamed {
			if o == k {
				out[i] = n
			}
		}
	}
	return out
}

// renames finds the columns renamed between old and rel, as [old, new]
// pairs (see above).
func (t *table) renames(old, rel pgcodec.Relation, qname string) ([][2]string, error) {
	byName := func(r pgcodec.Relation) map[string]int {
		m := map[string]int{}
		for i, c := range r.Columns {
			m[c.Name] = i
		}
		return m
	}
	oldAt, newAt := byName(old), byName(rel)
	var gone, fresh []int
	for i, c := range old.Columns {
		if _, ok := newAt[c.Name]; !ok {
			gone = append(gone, i)
		}
	}
	for i, c := range rel.Columns {
		if _, ok := oldAt[c.Name]; !ok {
			fresh = append(fresh, i)
		}
	}
	var out [][2]string
	if numbered(old) && numbered(rel) {
		// By number: a column whose number has another name now was
		// renamed (two may have swapped names).
		byNum := map[int16]string{}
		for _, c := range old.Columns {
			byNum[c.Num] = c.Name
		}
		for _, c := range rel.Columns {
			if was, ok := byNum[c.Num]; ok && was != c.Name {
				out = append(out, [2]string{was, c.Name})
			}
		}
		return out, nil
	}
	if len(gone) == 0 || len(fresh) == 0 {
		return nil, nil // only drops, or only adds
	}
	if len(gone) == 1 && len(fresh) == 1 && gone[0] == fresh[0] && gone[0] < len(old.Columns)-1 &&
		old.Columns[gone[0]].Type == rel.Columns[fresh[0]].Type {
		return [][2]string{{old.Columns[gone[0]].Name, rel.Columns[fresh[0]].Name}}, nil
	}
	return nil, fmt.Errorf("%w: %s: columns %v are gone from the source and %v are new: renamed, or dropped and added? "+
		"The source's DDL capture (its event trigger, which needs a superuser) tells them apart; without it, re-copy the table",
		ErrSchemaChange, qname, names(old, gone), names(rel, fresh))
}

// retyped reports whether column name of old (the one c was, renamed or
// not) had another type than c: the source changed it.
func retyped(old pgcodec.Relation, name string, c pgcodec.Column) bool {
	k := slices.IndexFunc(old.Columns, func(o pgcodec.Column) bool { return o.Name == name })
	return k >= 0 && (old.Columns[k].Type != c.Type || old.Columns[k].Base != c.Base)
}

// numbered reports whether every column of r carries its column number.
func numbered(r pgcodec.Relation) bool {
	return len(r.Columns) > 0 && !slices.ContainsFunc(r.Columns, func(c pgcodec.Column) bool { return c.Num == 0 })
}

func names(r pgcodec.Relation, at []int) []string {
	out := make([]string, len(at))
	for i, k := range at {
		out[i] = r.Columns[k].Name
	}
	return out
}

// dropPrimaryKeySQL drops table qname's primary key, whatever its name.
func dropPrimaryKeySQL(qname string) string {
	return fmt.Sprintf(`DO $cdcflow$ DECLARE c name; BEGIN
  SELECT conname INTO c FROM pg_constraint WHERE conrelid = %s::regclass AND contype = 'p';
  IF c IS NOT NULL THEN EXECUTE format('ALTER TABLE %%s DROP CONSTRAINT %%I', %s, c); END IF;
END $cdcflow$`, pgcodec.QuoteLiteral(qname), pgcodec.QuoteLiteral(qname))
}

// evolved records what an evolve to rel changed: the table's name, its
// columns (renamed, dropped, added, retyped) and key, as the target has
// them once its statements ran. Undone by restore if the transaction
// fails.
func (t *table) evolved(rel pgcodec.Relation, has targetTypes) {
	renames, _ := t.renames(t.rel, rel, t.qname)
	types := map[string]string{}
	var order []string
	for _, name := range t.order {
		if t.own[name] {
			types[name] = t.types[name]
			order = append(order, name)
		}
	}
	for _, c := range rel.Columns {
		typ, ok := t.types[c.Name]
		for _, r := range renames {
			if r[1] == c.Name {
				typ, ok = t.types[r[0]]
			}
		}
		if !ok || typ != c.Type && (c.Base == "" || typ != c.Base) && retyped(t.rel, c.Name, c) {
			typ = has.of(c)
		}
		types[c.Name] = typ
		order = append(order, c.Name)
	}
	for _, g := range rel.Generated {
		typ, ok := t.types[g.Name]
		if !ok {
			typ = g.Type // added by this version's evolve
		}
		types[g.Name] = typ
		order = append(order, g.Name)
	}
	if !maps.Equal(types, t.types) || !slices.Equal(order, t.order) || !slices.Equal(rel.KeyColumns(), t.key) || rel.QualifiedName() != t.qname {
		t.forget()
	}
	t.types, t.order, t.key, t.qname, t.rel = types, order, rel.KeyColumns(), rel.QualifiedName(), rel
}

// tableState is what evolved changes of a table, kept to restore it.
type tableState struct {
	rel   pgcodec.Relation
	qname string
	types map[string]string
	order []string
	key   []string
}

func (t *table) state() tableState {
	return tableState{rel: t.rel, qname: t.qname, types: t.types, order: t.order, key: t.key}
}

// restore puts back a state taken before a failed transaction's evolves.
func (t *table) restore(s tableState) {
	if s.qname != t.qname || !slices.Equal(s.order, t.order) {
		t.forget()
	}
	t.rel, t.qname, t.types, t.order, t.key = s.rel, s.qname, s.types, s.order, s.key
}

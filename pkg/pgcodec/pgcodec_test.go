package pgcodec

import (
	"regexp"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func sampleChanges() []RowChange {
	return []RowChange{
		{Change: Insert, Columns: []Datum{{Name: "id", Kind: Text, Text: []byte("1")}, {Name: "v", Kind: Null}, {Name: "e", Kind: Text, Text: []byte{}}}},
		{Change: Update, Columns: []Datum{{Name: "id", Kind: Text, Text: []byte("1")}, {Name: "big", Kind: Unchanged}}},
		{Change: Delete, Columns: []Datum{{Name: "id", Kind: Text, Text: []byte("1")}}},
		{Change: Move, Columns: []Datum{{Name: "id", Kind: Text, Text: []byte("2")}, {Name: "big", Kind: Unchanged}},
			From: []Datum{{Name: "id", Kind: Text, Text: []byte("1")}}},
		{Change: Update, Columns: []Datum{{Name: "v", Kind: Text, Text: []byte("2")}, {Name: "big", Kind: Null}},
			From: []Datum{{Name: "v", Kind: Text, Text: []byte("1")}, {Name: "big", Kind: Null}}}, // a keyless table's
		{Change: Update, Columns: []Datum{}, From: []Datum{}}, // of a table without columns
		{Change: Truncate, Cascade: true},
		{Change: Truncate, RestartIdentity: true},
	}
}

// Every change survives the encoding: null, empty text and unchanged
// values stay apart; every strict prefix is malformed, never a panic.
func TestValueRoundTrip(t *testing.T) {
	for _, c := range sampleChanges() {
		b := AppendValue(nil, c)
		got, err := DecodeValue(b)
		require.NoError(t, err)
		require.Equal(t, c, got)
		for n := range len(b) {
			_, err := DecodeValue(b[:n])
			require.ErrorIs(t, err, ErrMalformed, "prefix of %d bytes", n)
		}
	}
	long := RowChange{Change: Insert, Columns: []Datum{{Name: string(make([]byte, 63)), Kind: Text, Text: make([]byte, 20000)}}}
	for _, c := range append(sampleChanges(), long) {
		keyCols := [][]byte{[]byte("a"), {}, make([]byte, 200)}
		k, v := EncodeRow(7, keyCols, c)
		require.Equal(t, AppendKey(nil, 7, keyCols), k)
		require.Equal(t, AppendValue(nil, c), v)
		require.Equal(t, len(k), cap(k), "the key is capped at its size")
		require.Equal(t, len(v), cap(v), "the value is its size exactly")
	}
	key := AppendKey(nil, 7, [][]byte{[]byte("a"), {}})
	i, err := ChangeIndex(key)
	require.NoError(t, err)
	require.Equal(t, uint32(7), i)
	require.Less(t, string(AppendKey(nil, 1, [][]byte{[]byte("z")})), string(AppendKey(nil, 2, [][]byte{[]byte("a")})),
		"a transaction's changes sort in their order")
}

// Names that would become SQL identifiers are checked when decoded.
func TestDecodeRefusesBadNames(t *testing.T) {
	for _, name := range []string{"", "a\x00b", "\xff", string(make([]byte, 64))} {
		b := AppendValue(nil, RowChange{Change: Insert, Columns: []Datum{{Name: name, Kind: Null}}})
		_, err := DecodeValue(b)
		require.ErrorIs(t, err, ErrMalformed, "%q", name)
	}
	_, err := DecodeValue(append([]byte{rowVersion, byte(Insert)}, 0xff, 0xff, 0xff, 0x0f))
	require.ErrorIs(t, err, ErrMalformed, "a column count past the end")
}

// DecodeValueNames decodes what DecodeValue does; a name it was given is
// that string (in order or not), any other a copy, and every name is
// still validated.
func TestDecodeValueNamesReusesTheNamesGiven(t *testing.T) {
	names := []string{"id", "v", "e", "big"}
	for _, c := range sampleChanges() {
		b := AppendValue(nil, c)
		want, err := DecodeValue(b)
		require.NoError(t, err)
		got, err := DecodeValueNames(b, names)
		require.NoError(t, err)
		require.Equal(t, want, got)
		for _, d := range got.Columns {
			require.Contains(t, names, d.Name)
			k := slices.Index(names, d.Name)
			require.Same(t, unsafe.StringData(names[k]), unsafe.StringData(d.Name), "column %q is the name given", d.Name)
		}
	}
	b := AppendValue(nil, RowChange{Change: Insert, Columns: []Datum{{Name: "other", Kind: Null}, {Name: "id", Kind: Null}}})
	got, err := DecodeValueNames(b, names)
	require.NoError(t, err)
	require.Equal(t, "other", got.Columns[0].Name)
	require.Same(t, unsafe.StringData(names[0]), unsafe.StringData(got.Columns[1].Name), "a known name out of order")
	_, err = DecodeValueNames(AppendValue(nil, RowChange{Change: Insert, Columns: []Datum{{Name: "", Kind: Null}}}), []string{""})
	require.ErrorIs(t, err, ErrMalformed, "a name given is validated too")
}

func TestRelationDDLRoundTripAndValidate(t *testing.T) {
	r := Relation{OID: 16384, Schema: "public", Name: `we"ird`, Columns: []Column{{Name: "id", Type: "integer", TypeOID: 23, Key: true},
		{Name: "v", Type: "character varying(20)", TypeOID: 1043}}}
	got, err := ParseRelationDDL(RelationDDL(r))
	require.NoError(t, err)
	require.Equal(t, r, got)
	require.Equal(t, `"public"."we""ird"`, r.QualifiedName())
	require.Equal(t, []string{"id"}, r.KeyColumns())
	for name, bad := range map[string]Relation{
		"no key":         {OID: 1, Schema: "s", Name: "t", Columns: []Column{{Name: "a", Type: "int"}}},
		"injected type":  {OID: 1, Schema: "s", Name: "t", Columns: []Column{{Name: "a", Type: "int; DROP TABLE x", Key: true}}},
		"column twice":   {OID: 1, Schema: "s", Name: "t", Columns: []Column{{Name: "a", Type: "int", Key: true}, {Name: "a", Type: "int"}}},
		"bad table name": {OID: 1, Schema: "s", Name: "t\x00", Columns: []Column{{Name: "a", Type: "int", Key: true}}},
		"injected base":  {OID: 1, Schema: "s", Name: "t", Columns: []Column{{Name: "a", Type: "mood", Base: "text; DROP TABLE x", Key: true}}},
		"missing NUL":    {OID: 1, Schema: "s", Name: "t", Columns: []Column{{Name: "a", Type: "int", Key: true}, {Name: "b", Type: "text", Missing: "a\x00", HasMissing: true}}},
	} {
		_, err := ParseRelationDDL(RelationDDL(bad))
		require.ErrorIs(t, err, ErrMalformed, name)
	}
	for _, ok := range []Relation{
		{OID: 1, Schema: "s", Name: "t", Columns: []Column{{Name: "a", Type: "int"}}, Identity: IdentityFull},
		{OID: 1, Schema: "s", Name: "t", Columns: []Column{{Name: "a", Type: "int"}}, Identity: IdentityNone},
		{OID: 1, Schema: "s", Name: "t", Columns: []Column{}, Identity: IdentityNone}, // CREATE TABLE t ()
	} {
		got, err := ParseRelationDDL(RelationDDL(ok))
		require.NoError(t, err)
		require.Equal(t, ok, got)
		require.True(t, got.Keyless())
	}
	for name, bad := range map[string]Relation{
		"key and identity": {OID: 1, Schema: "s", Name: "t", Columns: []Column{{Name: "a", Type: "int", Key: true}}, Identity: IdentityFull},
		"unknown identity": {OID: 1, Schema: "s", Name: "t", Columns: []Column{{Name: "a", Type: "int"}}, Identity: "index"},
	} {
		_, err := ParseRelationDDL(RelationDDL(bad))
		require.ErrorIs(t, err, ErrMalformed, name)
	}
	_, err = ParseRelationDDL("ALTER TABLE t ADD c int")
	require.ErrorIs(t, err, ErrMalformed)
}

// A column of a created type carries its base type and a column added
// with a constant default the rows' value; both survive the DDL's text,
// and a sink creates the column as the base type.
func TestAColumnCarriesItsBaseTypeAndMissingValue(t *testing.T) {
	r := Relation{OID: 7, Schema: "s", Name: "t", Columns: []Column{{Name: "id", Type: "integer", TypeOID: 23, Key: true},
		{Name: "m", Type: `"Sales".mood[]`, TypeOID: 16390, Base: "text[]", Missing: "", HasMissing: true}}}
	got, err := ParseRelationDDL(RelationDDL(r))
	require.NoError(t, err)
	require.Equal(t, r, got, "an empty missing value is a value")
	require.Equal(t, "integer", got.Columns[0].TargetType())
	require.Equal(t, "text[]", got.Columns[1].TargetType())
}

func TestQuoteLiteral(t *testing.T) {
	for in, want := range map[string]string{
		"plain":         "'plain'",
		"it's":          "'it''s'",
		`a\b`:           `E'a\\b'`,
		`it's a \ back`: `E'it''s a \\ back'`,
		"":              "''",
	} {
		require.Equal(t, want, QuoteLiteral(in), in)
	}
}

func FuzzDecodeValue(f *testing.F) {
	for _, c := range sampleChanges() {
		f.Add(AppendValue(nil, c))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := DecodeValue(b)
		if err != nil {
			require.ErrorIs(t, err, ErrMalformed)
			return
		}
		again, err := DecodeValue(AppendValue(nil, c))
		require.NoError(t, err)
		require.Equal(t, c, again)
		named, err := DecodeValueNames(b, []string{"id", "v"})
		require.NoError(t, err)
		require.Equal(t, c, named)
	})
}

// A column's type is pasted into CREATE TABLE and ALTER TABLE unquoted, so
// it must read as a type name and nothing more: what a space or a
// parenthesis could bring in besides (a generated expression that runs a
// function on the target, a default, a constraint, a collation) is refused.
func TestATypeNameCarriesNothingButAType(t *testing.T) {
	for _, typ := range []string{
		"integer", "text", "character varying(20)", "numeric(10,2)", "numeric(5,-2)", "double precision",
		"timestamp(3) with time zone", "timestamp without time zone", "time(6) without time zone",
		"interval day to second(3)", "interval year to month", "bit varying(5)", `"char"`, "text[]",
		"integer[][]", `"Sales".mood[]`, `public."we""ird type"`, "geometry(PointZ,4326)", "ext$1.t_2",
	} {
		require.True(t, validType(typ), "%q refused", typ)
	}
	for _, typ := range []string{
		"", "int; DROP TABLE x", "text GENERATED ALWAYS AS (pg_read_file('/etc/hostname')) STORED",
		"text GENERATED ALWAYS AS IDENTITY", "integer NOT NULL", "integer DEFAULT 5", "text COLLATE \"C\"",
		"integer REFERENCES secrets", "integer PRIMARY KEY", "text CHECK (false)", "numeric(10,2) DEFAULT 1",
		"numeric(1 2)", "numeric(1,(2))", "numeric(", "text)", "a.", ".a", "a..b", "a  b", "text [] ",
		`"unterminated`, `""`, "\"a\x00\"", "int\x00", "text -- comment", "text/*x*/", "int'", "[]",
		"integer varying(1) with (x)", "1integer", "character varying(20)extra", "integer time.x",
	} {
		require.False(t, validType(typ), "%q accepted", typ)
	}
	// Through the DDL a sink parses: the same refusal, a typed error.
	r := Relation{OID: 1, Schema: "s", Name: "t", Columns: []Column{{Name: "id", Type: "integer", Key: true},
		{Name: "x", Type: "text GENERATED ALWAYS AS (pg_read_file('/etc/hostname')) STORED"}}}
	_, err := ParseRelationDDL(RelationDDL(r))
	require.ErrorIs(t, err, ErrMalformed)
}

// Whatever bytes a DDL's type holds, validType does not panic, and what it
// accepts can only be a type name: no quote that ends a literal, no
// statement or comment separator, no control character, and a space only
// before one of the multi-word types' words.
func FuzzValidType(f *testing.F) {
	for _, s := range []string{"integer", "character varying(20)", `"Sales".mood[]`, "timestamp(3) with time zone",
		"text GENERATED ALWAYS AS (1) STORED", "int; DROP TABLE x", `public."we""ird"`, "numeric(5,-2)"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, typ string) {
		if !validType(typ) {
			return
		}
		unquoted := regexp.MustCompile(`"([^"]|"")*"`).ReplaceAllString(typ, `"q"`)
		require.NotContains(t, unquoted, "'")
		require.NotContains(t, unquoted, ";")
		require.NotContains(t, unquoted, "--")
		require.NotContains(t, unquoted, "/*")
		for _, r := range unquoted {
			require.False(t, r < ' ' || r == 0x7f, "%q: a control character", typ)
		}
		for _, w := range strings.Split(unquoted, " ")[1:] {
			word := strings.ToLower(strings.TrimRight(strings.SplitN(w, "(", 2)[0], "[]"))
			require.True(t, typeWord(word), "%q: %q after a space", typ, word)
		}
	})
}

// A generated column's expression is spliced into a target's CREATE
// TABLE: one that could end its clause (a semicolon, a comment, an
// unbalanced parenthesis outside a string or a quoted identifier) does not
// validate; pg_get_expr's own output does.
func TestAGeneratedExpressionCannotLeaveItsClause(t *testing.T) {
	for _, ok := range []string{
		"(a * 2)", "((a + b) * 2)", "upper(b)", `(b || ';'::text)`, `("we""ird" + 1)`, `(b || ')'::text)`,
		`(b || E'\\'::text)`, `(b || E'it\'s);'::text)`, "(b || '--'::text)", "(j -> 'k'::text)", "a", "(b || 'it''s'::text)",
	} {
		require.NoError(t, checkExpr(ok), ok)
	}
	for _, bad := range []string{
		"", "a); DROP TABLE x; --", "(a", "a)", "a -- comment", "a /* c */", "(b || 'open", `("open`, "$$x$$", "$tag$x$tag$", "a;b",
		"a\x00", strings.Repeat("(", 40000) + strings.Repeat(")", 40000), `(b || 'a\');'::text)`,
	} {
		require.Error(t, checkExpr(bad), bad)
	}
	r := Relation{OID: 1, Schema: "s", Name: "t", Columns: []Column{{Name: "a", Type: "integer", Key: true}},
		Generated: []GeneratedColumn{{Name: "b", Type: "integer", Expr: "(a * 2)"}}}
	got, err := ParseRelationDDL(RelationDDL(r))
	require.NoError(t, err)
	require.Equal(t, r, got)
	r.Generated[0].Expr = "a) STORED); DROP TABLE x; --"
	_, err = ParseRelationDDL(RelationDDL(r))
	require.ErrorIs(t, err, ErrMalformed)
	r.Generated[0] = GeneratedColumn{Name: "a", Type: "integer", Expr: "1"}
	_, err = ParseRelationDDL(RelationDDL(r))
	require.ErrorIs(t, err, ErrMalformed, "a name taken by a column")
}

// A generated column's expression crosses the event store: whatever it
// holds, checking it never panics, and one that passes has balanced
// parentheses and no semicolon outside a string.
func FuzzCheckExpr(f *testing.F) {
	for _, s := range []string{"(a * 2)", "a); DROP TABLE x; --", `(b || E'\');'::text)`, `"q""x"`, "$$", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, e string) {
		if checkExpr(e) != nil {
			return
		}
		require.NotContains(t, strings.Map(func(r rune) rune {
			if r == '\'' || r == '"' {
				return -1
			}
			return r
		}, e), "\x00")
	})
}

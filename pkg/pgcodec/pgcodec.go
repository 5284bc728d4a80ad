package pgcodec

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/cdcflow/eventservice/internal/wirereader"
	"github.com/cdcflow/eventservice/pkg/common"
)

// Change is the kind of a row change.
type Change byte

// Changes.
const (
	Insert   Change = 'I'
	Update   Change = 'U'
	Delete   Change = 'D'
	Truncate Change = 'T'
	// Move is an update that changed the row's key and left a TOASTed
	// column unchanged: the row at From (the old key's columns) moves to
	// the new key, its Columns, an unchanged column's value taken from
	// the old row. Not an insert: the new row's unchanged value exists
	// only in the old row, which a delete would lose (an update that
	// changed the key with nothing unchanged is a delete and an insert).
	Move Change = 'M'
)

func (c Change) valid() bool {
	return c == Insert || c == Update || c == Delete || c == Truncate || c == Move
}

// String names the change.
func (c Change) String() string {
	switch c {
	case Insert:
		return "insert"
	case Update:
		return "update"
	case Delete:
		return "delete"
	case Truncate:
		return "truncate"
	case Move:
		return "move"
	}
	return fmt.Sprintf("change(%d)", byte(c))
}

// Kind is what a column's value is.
type Kind byte

// Kinds, as pgoutput names them.
const (
	Null      Kind = 'n'
	Unchanged Kind = 'u' // a TOASTed value an update left as it was
	Text      Kind = 't'
)

// Datum is one column's value in a change.
type Datum struct {
	Name string
	Kind Kind
	Text []byte // Kind Text only
}

// RowChange is a decoded change.
type RowChange struct {
	Change  Change
	Columns []Datum
	// From is a move's old key (its key columns' values), or the whole
	// old row of an update of a keyless table (Relation.Identity full,
	// which finds the row by it).
	From []Datum
	// Cascade and RestartIdentity are a truncate's options.
	Cascade, RestartIdentity bool
}

const rowVersion = 1

// AppendValue appends the encoding of c to b.
func AppendValue(b []byte, c RowChange) []byte {
	code := byte(c.Change)
	if c.Change == Update && c.From != nil {
		code = updateWithOld
	}
	b = append(b, rowVersion, code)
	if c.Change == Truncate {
		var opts byte
		if c.Cascade {
			opts |= 1
		}
		if c.RestartIdentity {
			opts |= 2
		}
		return append(b, opts)
	}
	b = appendDatums(b, c.Columns)
	if c.hasFrom() {
		b = appendDatums(b, c.From)
	}
	return b
}

// updateWithOld is the encoding's code of an update with From (a keyless
// table's old row), so that an update without one keeps the encoding it
// always had and no strict prefix of either decodes.
const updateWithOld = 'W'

// hasFrom reports whether c's encoding carries From: a move's, and an
// update's that has one.
func (c RowChange) hasFrom() bool { return c.Change == Move || c.Change == Update && c.From != nil }

func appendDatums(b []byte, ds []Datum) []byte {
	b = binary.AppendUvarint(b, uint64(len(ds)))
	for _, d := range ds {
		b = binary.AppendUvarint(b, uint64(len(d.Name)))
		b = append(b, d.Name...)
		b = append(b, byte(d.Kind))
		if d.Kind == Text {
			b = binary.AppendUvarint(b, uint64(len(d.Text)))
			b = append(b, d.Text...)
		}
	}
	return b
}

// datumsLen is the length appendDatums gives ds.
func datumsLen(ds []Datum) int {
	n := uvarintLen(uint64(len(ds)))
	for _, d := range ds {
		n += uvarintLen(uint64(len(d.Name))) + len(d.Name) + 1
		if d.Kind == Text {
			n += uvarintLen(uint64(len(d.Text))) + len(d.Text)
		}
	}
	return n
}

// AppendKey appends a change's row key: its index in the transaction,
// then the key columns' values (length-prefixed; a null is length 0 with
// no marker, which a key cannot hold).
func AppendKey(b []byte, index uint32, key [][]byte) []byte {
	b = binary.BigEndian.AppendUint32(b, index)
	for _, v := range key {
		b = binary.AppendUvarint(b, uint64(len(v)))
		b = append(b, v...)
	}
	return b
}

// EncodeRow returns a change's row key (AppendKey) and value
// (AppendValue) in one allocation of their exact sizes, each slice capped
// so that an append to one cannot write into the other: a source encodes
// every row it reads, and growing two buffers from nil was several
// allocations per row.
func EncodeRow(index uint32, key [][]byte, c RowChange) (k, v []byte) {
	ks := 4
	for _, kv := range key {
		ks += uvarintLen(uint64(len(kv))) + len(kv)
	}
	vs := 3
	if c.Change != Truncate {
		vs = 2 + datumsLen(c.Columns)
		if c.hasFrom() {
			vs += datumsLen(c.From)
		}
	}
	buf := make([]byte, 0, ks+vs)
	k = AppendKey(buf[:0:ks], index, key)
	v = AppendValue(buf[ks:ks:ks+vs], c)
	return k, v
}

// uvarintLen is the length binary.AppendUvarint gives x.
func uvarintLen(x uint64) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutUvarint(b[:], x)
}

// ChangeIndex returns the index a row key starts with.
func ChangeIndex(key []byte) (uint32, error) {
	if len(key) < 4 {
		return 0, fmt.Errorf("%w: a %d-byte row key", ErrMalformed, len(key))
	}
	return binary.BigEndian.Uint32(key), nil
}

// Op is the store operation of a change.
func Op(c Change) common.OpType {
	if c == Delete || c == Truncate {
		return common.OpDelete
	}
	return common.OpPut
}

// DecodeValue decodes a row value. Text slices alias b.
func DecodeValue(b []byte) (RowChange, error) { return DecodeValueNames(b, nil) }

// DecodeValueNames is DecodeValue with the column names a value is
// expected to hold (a table's, in order): a name equal to one of them is
// that string, not a new one, so a sink decoding every row of a table
// allocates no names. Any name is still validated.
func DecodeValueNames(b []byte, names []string) (RowChange, error) {
	d := decoder{Reader: wirereader.New(b, ErrMalformed), names: names}
	if v := d.U8("value"); d.Err() == nil && v != rowVersion {
		return RowChange{}, fmt.Errorf("%w: row version %d", ErrMalformed, v)
	}
	code := d.U8("value")
	c := RowChange{Change: Change(code)}
	if code == updateWithOld {
		c.Change = Update
	}
	if d.Err() == nil && !c.Change.valid() {
		return RowChange{}, fmt.Errorf("%w: change %d", ErrMalformed, byte(c.Change))
	}
	if c.Change == Truncate {
		opts := d.U8("value")
		c.Cascade, c.RestartIdentity = opts&1 != 0, opts&2 != 0
		return c, d.End("the end")
	}
	if c.Columns = d.datums(); (c.Change == Move || code == updateWithOld) && d.Err() == nil {
		c.From = d.datums()
	}
	if err := d.Err(); err != nil {
		return RowChange{}, err
	}
	return c, d.End("the end")
}

// datums reads a count of columns and the columns.
func (d *decoder) datums() []Datum {
	// A column takes at least a name length and a kind.
	n := d.Count(d.Uvarint(), 2, "columns")
	if d.Err() != nil {
		return nil
	}
	ds := make([]Datum, n)
	for i := range ds {
		col := &ds[i]
		col.Name = d.name(i)
		col.Kind = Kind(d.U8("value"))
		switch col.Kind {
		case Null, Unchanged:
		case Text:
			col.Text = d.Bytes(d.Uvarint(), "column")
			if col.Text == nil && d.Err() == nil {
				col.Text = []byte{}
			}
		default:
			d.Failf("column kind %d", byte(col.Kind))
		}
		if d.Err() != nil {
			return nil
		}
	}
	return ds
}

// decoder reads a row value: wirereader's reads, and the names it
// expects.
type decoder struct {
	wirereader.Reader
	names []string // expected column names (DecodeValueNames)
}

// name reads the name of column i (of a relation: i < 0).
func (d *decoder) name(i int) string {
	b := d.Bytes(d.Uvarint(), "name")
	s := ""
	if i >= 0 && i < len(d.names) && string(b) == d.names[i] {
		s = d.names[i] // the common case: the table's columns in order
	} else {
		for _, n := range d.names {
			if string(b) == n { // (a comparison: no conversion)
				s = n
				break
			}
		}
		if s == "" {
			s = string(b)
		}
	}
	if d.Err() == nil {
		if err := checkName(s); err != nil {
			d.Fail(err.Error())
		}
	}
	return s
}

// maxNameBytes is PostgreSQL's identifier limit (NAMEDATALEN-1).
const maxNameBytes = 63

// checkName checks an identifier from the wire or a DDL: valid UTF-8,
// no NUL, at most 63 bytes, not empty.
func checkName(s string) error {
	switch {
	case s == "":
		return errors.New("empty name")
	case len(s) > maxNameBytes:
		return fmt.Errorf("name of %d bytes", len(s))
	case !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0:
		return fmt.Errorf("name %q is not valid UTF-8 without NUL", s)
	}
	return nil
}

// Column is one column of a relation.
type Column struct {
	Name string `json:"name"`
	// Type is the SQL type as format_type writes it ("integer",
	// "character varying(20)").
	Type    string `json:"type"`
	TypeOID uint32 `json:"type_oid"`
	Key     bool   `json:"key,omitempty"`
	// Base is, for a type that is not built in (an enum, a domain, a
	// composite, an extension's type), the built-in type a sink creates
	// the column with, since the target may not have Type: a domain's
	// base type, text for the rest (an enum's label, a composite's
	// text form), with [] for an array of one. Empty for a built-in
	// type.
	Base string `json:"base,omitempty"`
	// Missing is, when HasMissing, the text of the value that the rows
	// which existed when the column was added hold without any row
	// change saying so (PostgreSQL's attmissingval, kept by ADD COLUMN
	// with a constant default). A sink adding the column gives it to
	// the rows it holds.
	Missing    string `json:"missing,omitempty"`
	HasMissing bool   `json:"has_missing,omitempty"`
	// Num is the column's number in its table (attnum; 0: not known),
	// which a rename keeps: a sink tells a renamed column from a dropped
	// one and an added one by it.
	Num int16 `json:"num,omitempty"`
}

// TargetType is the type a sink creates c with: Base when set, else Type.
func (c Column) TargetType() string {
	if c.Base != "" {
		return c.Base
	}
	return c.Type
}

// validType reports whether a type name may be written into SQL: it must
// read as a type name as format_type writes one, and nothing else, since a
// sink pastes it into CREATE TABLE and ALTER TABLE unquoted. The grammar:
// name parts (a bare identifier, or a quoted one with "" for a quote)
// joined by '.' (a schema), each optionally followed by a type modifier of
// digits and words ("(20)", "(10,2)", "(5,-2)", an extension's
// "(Point,4326)"); after a space, only the words of SQL's multi-word types
// ("character varying", "double precision", "timestamp(3) with time zone",
// "interval day to second"); then any number of "[]". What a space could
// otherwise bring in (NOT NULL, DEFAULT, GENERATED ALWAYS AS (...),
// REFERENCES, COLLATE) is a column's constraint, not its type, and is
// refused.
func validType(t string) bool {
	if t == "" || len(t) > 256 || !utf8.ValidString(t) {
		return false
	}
	for strings.HasSuffix(t, "[]") {
		t = t[:len(t)-2]
	}
	afterSpace := false
	for i := 0; ; {
		if i >= len(t) {
			return false // an empty part: "", "a.", "a ", "[]"
		}
		switch c := t[i]; {
		case c == '"':
			if afterSpace {
				return false
			}
			j, ok := quotedIdentEnd(t, i)
			if !ok {
				return false
			}
			i = j
		case isIdentStart(c):
			j := i + 1
			for j < len(t) && isIdentByte(t[j]) {
				j++
			}
			if afterSpace && !typeWord(strings.ToLower(t[i:j])) {
				return false
			}
			i = j
		default:
			return false
		}
		if i < len(t) && t[i] == '(' {
			j := strings.IndexByte(t[i:], ')')
			if j < 0 || !validTypmod(t[i+1:i+j]) {
				return false
			}
			i += j + 1
		}
		if i == len(t) {
			return true
		}
		switch t[i] {
		case '.':
			if afterSpace {
				return false // a type's word is never a schema
			}
		case ' ':
			afterSpace = true
		default:
			return false
		}
		i++
	}
}

// quotedIdentEnd returns the index just past the quoted identifier that
// starts at t[i] == '"' ("" inside stands for one quote), and false when it
// is unterminated, empty or holds a NUL.
func quotedIdentEnd(t string, i int) (int, bool) {
	for j := i + 1; j < len(t); j++ {
		switch t[j] {
		case 0:
			return 0, false
		case '"':
			if j+1 < len(t) && t[j+1] == '"' {
				j++
				continue
			}
			return j + 1, j > i+1
		}
	}
	return 0, false
}

// validTypmod reports whether m, what lies between a type modifier's
// parentheses, is a comma-separated list of (possibly negative) numbers
// and bare words.
func validTypmod(m string) bool {
	for _, item := range strings.Split(m, ",") {
		item = strings.TrimPrefix(item, "-")
		if item == "" {
			return false
		}
		for k := 0; k < len(item); k++ {
			if !isIdentByte(item[k]) {
				return false
			}
		}
	}
	return true
}

func isIdentStart(c byte) bool {
	return c == '_' || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z')
}

func isIdentByte(c byte) bool { return isIdentStart(c) || c == '$' || ('0' <= c && c <= '9') }

// typeWord reports whether w may follow a space in a type name: the words
// of SQL's multi-word types as format_type writes them.
func typeWord(w string) bool {
	switch w {
	case "varying", "precision", "with", "without", "time", "zone",
		"year", "month", "day", "hour", "minute", "second", "to":
		return true
	}
	return false
}

// Relation is a table as the source sees it.
type Relation struct {
	OID     uint32   `json:"oid"`
	Schema  string   `json:"schema"`
	Name    string   `json:"name"`
	Columns []Column `json:"columns"`
	// Identity is how a table without a key column finds its rows (empty
	// for a table with one): IdentityFull, by the whole old row (REPLICA
	// IDENTITY FULL: its updates carry RowChange.From, its deletes every
	// column), or IdentityNone, not at all (the default identity or
	// NOTHING without a key: PostgreSQL refuses such a table's updates
	// and deletes once a publication publishes them, so only its inserts
	// and truncates are streamed).
	Identity string `json:"identity,omitempty"`
	// Generated are its stored generated columns (generated.go), which
	// the stream never carries: a description read from the source's
	// catalog has them, one of a stream's relation message not.
	Generated []GeneratedColumn `json:"generated,omitempty"`
	// UnknownConversion is the statement (its first 1000 characters) of
	// the DDL that made this version, as the source's DDL capture gave
	// it, when a column type it changed may have been converted by an
	// expression of its own (ALTER COLUMN ... TYPE ... USING), which
	// the target cannot know: a sink stops the table at such a type
	// change rather than convert the values it holds by a cast, which
	// could give others than the source's. Empty for a plain ALTER.
	UnknownConversion string `json:"unknown_conversion,omitempty"`
}

// Identities of a table without a key column (Relation.Identity).
const (
	IdentityFull = "full"
	IdentityNone = "none"
)

// Keyless reports whether r has no key column: its rows are not
// collapsed or upserted by key but applied one by one, in order.
func (r Relation) Keyless() bool { return r.Identity != "" }

// Validate checks what a sink will turn into SQL: names, types, at least
// one key column or an identity without one.
func (r Relation) Validate() error {
	var errs []error
	for _, n := range []string{r.Schema, r.Name} {
		if err := checkName(n); err != nil {
			errs = append(errs, err)
		}
	}
	keys := 0
	seen := map[string]bool{}
	for _, c := range r.Columns {
		if err := checkName(c.Name); err != nil {
			errs = append(errs, err)
		}
		if seen[c.Name] {
			errs = append(errs, fmt.Errorf("column %q twice", c.Name))
		}
		seen[c.Name] = true
		if !validType(c.Type) {
			errs = append(errs, fmt.Errorf("column %q: type %q", c.Name, c.Type))
		}
		if c.Base != "" && !validType(c.Base) {
			errs = append(errs, fmt.Errorf("column %q: base type %q", c.Name, c.Base))
		}
		if !utf8.ValidString(c.Missing) || strings.IndexByte(c.Missing, 0) >= 0 {
			errs = append(errs, fmt.Errorf("column %q: a missing value that is not UTF-8 without NUL", c.Name))
		}
		if c.Key {
			keys++
		}
		if c.Num < 0 {
			errs = append(errs, fmt.Errorf("column %q: number %d", c.Name, c.Num))
		}
	}
	errs = append(errs, r.validateGenerated(seen)...)
	switch {
	case r.Identity != "" && r.Identity != IdentityFull && r.Identity != IdentityNone:
		errs = append(errs, fmt.Errorf("identity %q", r.Identity))
	case r.Identity != "" && keys > 0:
		errs = append(errs, fmt.Errorf("%s has key columns and identity %q", r.QualifiedName(), r.Identity))
	case r.Identity == "" && keys == 0:
		errs = append(errs, fmt.Errorf("%s has no key column", r.QualifiedName()))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: relation %d: %w", ErrMalformed, r.OID, err)
	}
	return nil
}

// QualifiedName is the quoted schema.name of r.
func (r Relation) QualifiedName() string { return QuoteIdent(r.Schema) + "." + QuoteIdent(r.Name) }

// KeyColumns returns the names of the key columns, in column order.
func (r Relation) KeyColumns() []string {
	var out []string
	for _, c := range r.Columns {
		if c.Key {
			out = append(out, c.Name)
		}
	}
	return out
}

// TextFormatParams returns the session settings under which a value's
// text means the same at both ends, whatever either server's
// configuration: a source sends values as text in its session's formats
// (pgoutput's tuples, the snapshot's rows), and a target reads them in its
// own. A server configured with DateStyle 'SQL, DMY' and TimeZone
// 'Asia/Kolkata' printed 2026-03-04 as 04/03/2026 and a time as IST, which
// a target of the default MDY read as April the 3rd, three and a half
// hours off; extra_float_digits below 1 rounds floats. A source and a sink
// set them as runtime parameters of every connection that reads or writes
// values. A new map each call.
func TextFormatParams() map[string]string {
	return map[string]string{
		"DateStyle":          "ISO, YMD",
		"IntervalStyle":      "postgres",
		"TimeZone":           "UTC",
		"extra_float_digits": "3",
		"bytea_output":       "hex",
		"lc_monetary":        "C",
	}
}

// QuoteIdent quotes an identifier for SQL.
func QuoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// QuoteLiteral quotes a string constant for SQL, whatever the server's
// standard_conforming_strings: one with a backslash is an escape string
// (E'...') with the backslashes doubled.
func QuoteLiteral(s string) string {
	s = strings.ReplaceAll(s, "'", "''")
	if strings.Contains(s, `\`) {
		return `E'` + strings.ReplaceAll(s, `\`, `\\`) + `'`
	}
	return "'" + s + "'"
}

const relationPrefix = "cdcflow/relation/v1 "

// RelationDDL is the DDL text of r.
func RelationDDL(r Relation) string {
	b, _ := json.Marshal(r) // plain types: cannot fail
	return relationPrefix + string(b)
}

const dropPrefix = "cdcflow/drop-table/v1 "

// DropTableDDL is the DDL text of source table oid dropped.
func DropTableDDL(oid uint32) string { return dropPrefix + strconv.FormatUint(uint64(oid), 10) }

// ParseDropTableDDL parses what DropTableDDL wrote: ok false for any
// other DDL text.
func ParseDropTableDDL(q string) (oid uint32, ok bool) {
	body, ok := strings.CutPrefix(q, dropPrefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(body, 10, 32)
	if err != nil || n == 0 {
		return 0, false
	}
	return uint32(n), true
}

// ParseRelationDDL parses what RelationDDL wrote, validated.
func ParseRelationDDL(q string) (Relation, error) {
	body, ok := strings.CutPrefix(q, relationPrefix)
	if !ok {
		return Relation{}, fmt.Errorf("%w: not a relation DDL: %.40q", ErrMalformed, q)
	}
	var r Relation
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		return Relation{}, fmt.Errorf("%w: relation DDL: %w", ErrMalformed, err)
	}
	return r, r.Validate()
}

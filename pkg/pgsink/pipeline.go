package pgsink

import (
	"context"
	"encoding/binary"
	"math"
	"strconv"
	"strings"
)

// A lane's commit as it goes on the wire: its statements and their
// parameters, already encoded, sent over the lane's pgconn as one
// pipeline.
//
// The lanes used to queue pgx batches of pgtype values, whose per-argument
// work (boxing each value, finding its encode plan, building each Bind) is
// paid per row at 1000 tables, where most statements carry one row. Every
// parameter of a lane statement is text (the SQL casts it) or an array of
// text, and the rows' values are text as the source sent them, so a
// parameter is the row's own bytes, or an array encoded once into the
// pipeline's buffer in PostgreSQL's binary array format. emptyText and
// allBinary are read-only.

// stmt is a statement a lane prepares on its connection, under its own
// name (pgx's statement cache is not asked: it would describe it again
// and find its encode plans at each use).
type stmt struct {
	sql  string
	name string // given by the lane that prepares it first ("": not yet)
	// conn is the lane connection it is prepared on (the lane's count
	// of connections; 0: none).
	conn uint64
}

// pstmt is one statement of a pipeline: a prepared one, or (prep nil) a
// statement sent as is (TRUNCATE, ALTER TABLE).
type pstmt struct {
	prep    *stmt
	sql     string // prep's SQL, or the statement's own
	params  [][]byte
	formats []int16 // the params' (nil: all text; allBinary: all arrays)
}

// pipeline is a commit's statements in order. buf holds the bytes of the
// parameters encoded here (arrays, in the binary format; numbers); the
// others are the rows' own bytes, text (see batch: they outlive the
// commit).
type pipeline struct {
	stmts []pstmt
	buf   []byte
}

// keptBuf is the most buffer a lane keeps for its next commit: a commit
// of large values (a TOASTed column of megabytes in an array) does not
// pin that much for the lane's life.
const keptBuf = 1 << 20

// release forgets the rows' bytes (they are not the lane's to keep) and
// an outsized buffer, after a commit.
func (p *pipeline) release() {
	clear(p.stmts)
	if cap(p.buf) > keptBuf {
		p.buf = nil
	}
}

// add queues prepared statement s with text parameters.
func (p *pipeline) add(s *stmt, params ...[]byte) {
	p.stmts = append(p.stmts, pstmt{prep: s, sql: s.sql, params: params})
}

// addArrays queues prepared statement s whose parameters are all arrays
// (binary).
func (p *pipeline) addArrays(s *stmt, params ...[]byte) {
	p.stmts = append(p.stmts, pstmt{prep: s, sql: s.sql, params: params, formats: allBinary})
}

// addPlain queues a statement without parameters, sent as is.
func (p *pipeline) addPlain(sql string) { p.stmts = append(p.stmts, pstmt{sql: sql}) }

// hasDDL reports whether p holds a schema change (see applier.send): an
// ALTER TABLE, a CREATE SCHEMA, a DO block (evolve.go's) or a DROP TABLE.
func (p *pipeline) hasDDL() bool {
	for _, s := range p.stmts {
		if s.prep == nil && (strings.HasPrefix(s.sql, "ALTER TABLE") || strings.HasPrefix(s.sql, "CREATE SCHEMA") || strings.HasPrefix(s.sql, "DO ") ||
			strings.HasPrefix(s.sql, "DROP TABLE")) {
			return true
		}
	}
	return false
}

// emptyText is the parameter of an empty text value: a nil parameter is
// NULL to pgconn.
var emptyText = []byte{}

// text is v as a text parameter (never nil: NULL is nil).
func text(v []byte) []byte {
	if v == nil {
		return emptyText
	}
	return v
}

// int64Param encodes n into p's buffer.
func (p *pipeline) int64Param(n int64) []byte {
	start := len(p.buf)
	p.buf = strconv.AppendInt(p.buf, n, 10)
	return p.buf[start:len(p.buf):len(p.buf)]
}

// The element types of the arrays a lane sends (pg_type's OIDs).
const (
	oidText = 25
	oidInt8 = 20
)

// textArray encodes vals (nil: NULL) as a one-dimensional text[] in
// PostgreSQL's binary array format into p's buffer: no value needs
// quoting or escaping, and the server copies each element instead of
// parsing the array's text form (array_in, a character at a time, which
// a drain's arrays of thousands of values paid).
func (p *pipeline) textArray(n int, val func(i int) []byte) []byte {
	start := p.arrayHeader(n, oidText)
	for i := range n {
		v := val(i)
		if v == nil {
			p.buf = binary.BigEndian.AppendUint32(p.buf, math.MaxUint32) // -1: NULL
			p.buf[start+7] = 1                                           // the header's has-nulls flag
			continue
		}
		p.buf = binary.BigEndian.AppendUint32(p.buf, uint32(len(v)))
		p.buf = append(p.buf, v...)
	}
	return p.buf[start:len(p.buf):len(p.buf)]
}

// int8Array encodes n values as a one-dimensional bigint[] in the binary
// array format into p's buffer.
func (p *pipeline) int8Array(n int, val func(i int) int64) []byte {
	start := p.arrayHeader(n, oidInt8)
	for i := range n {
		p.buf = binary.BigEndian.AppendUint32(p.buf, 8)
		p.buf = binary.BigEndian.AppendUint64(p.buf, uint64(val(i)))
	}
	return p.buf[start:len(p.buf):len(p.buf)]
}

// arrayHeader appends the header of a one-dimensional array of n
// elements of type elem (no NULLs yet) and returns where it starts.
func (p *pipeline) arrayHeader(n int, elem uint32) int {
	start := len(p.buf)
	p.buf = binary.BigEndian.AppendUint32(p.buf, 1) // dimensions
	p.buf = binary.BigEndian.AppendUint32(p.buf, 0) // has nulls
	p.buf = binary.BigEndian.AppendUint32(p.buf, elem)
	p.buf = binary.BigEndian.AppendUint32(p.buf, uint32(n)) // the dimension's length
	p.buf = binary.BigEndian.AppendUint32(p.buf, 1)         // and lower bound
	return start
}

// allBinary is the parameter formats of a statement whose parameters are
// all arrays (binary); nil, all text, is every other statement's.
var allBinary = []int16{1}

// exec sends p on the lane's connection as one pipeline, one implicit
// transaction (all or nothing), in one round trip: a statement the
// connection has not prepared yet is prepared in the pipeline just before
// its first use (a restart at 1000 tables meets some 750 new statements a
// lane, which a round trip each would hold up for a second). Just before,
// not at the head: parsing a statement locks the tables it names, and
// nothing of the commit may touch the target's tables before its fence
// (fence.go) has run.
func (a *applier) exec(ctx context.Context, p *pipeline) error {
	pl := a.conn.PgConn().StartPipeline(ctx)
	var fresh []*stmt
	for _, s := range p.stmts {
		if s.prep == nil {
			pl.SendQueryParams(s.sql, nil, nil, nil, nil)
			continue
		}
		if s.prep.conn != a.connections {
			a.name(s.prep)
			pl.SendPrepare(s.prep.name, s.prep.sql, nil)
			s.prep.conn = a.connections
			fresh = append(fresh, s.prep)
		}
		pl.SendQueryPrepared(s.prep.name, s.params, s.formats, nil)
	}
	err := pl.Sync()
	if cerr := pl.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		// A statement prepared in a pipeline that failed later stays
		// prepared (PostgreSQL's prepared statements are not
		// transactional), so the next try prepares it under a new name:
		// under its own, the retry of the tables one by one failed with
		// 42P05 (TestARefusedChangeFailsOnlyItsTable).
		for _, s := range fresh {
			s.name, s.conn = "", 0
		}
	}
	return err
}

// name gives st a name of the lane's if it has none (a statement that
// failed to prepare was unnamed: its name is spent).
func (a *applier) name(st *stmt) {
	if st.name == "" {
		a.named++
		st.name = "cdcflow_" + strconv.Itoa(a.n) + "_" + strconv.FormatUint(a.named, 10)
	}
}

// runInTransaction sends p's statements one by one, unprepared, in an
// explicit transaction: a pipeline prepares (parses) every statement
// before it runs any, and an upsert that names a column an ALTER TABLE
// before it adds would not parse.
func (a *applier) runInTransaction(ctx context.Context, p *pipeline) (err error) {
	pc := a.conn.PgConn()
	if _, err := pc.Exec(ctx, "BEGIN").ReadAll(); err != nil {
		return err
	}
	defer func() {
		if err != nil && !pc.IsClosed() {
			_, _ = pc.Exec(context.Background(), "ROLLBACK").ReadAll()
		}
	}()
	for _, s := range p.stmts {
		if _, err := pc.ExecParams(ctx, s.sql, s.params, nil, s.formats, nil).Close(); err != nil {
			return err
		}
	}
	_, err = pc.Exec(ctx, "COMMIT").ReadAll()
	return err
}

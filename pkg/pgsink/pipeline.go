package pgsink

import (
	"context"
	"strconv"
)

// A lane's commit as it goes on the wire: its statements and their
// parameters, already text, sent over the lane's pgconn as one pipeline.
//
// The lanes used to queue pgx batches of pgtype values; at 1000 tables,
// where most statements carry one row, pgx's per-argument work (boxing
// each value, finding its encode plan, building each Bind) was about a
// fifth of serve's CPU (a profile of make pgbench's live load). Every
// parameter of a lane statement is text (the SQL casts it), and the rows'
// values are text as the source sent them, so a parameter is the row's
// own bytes, or a text array encoded once into the pipeline's buffer.

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
	prep   *stmt
	sql    string // prep's SQL, or the statement's own
	params [][]byte
}

// pipeline is a commit's statements in order. buf holds the bytes of the
// parameters encoded here (arrays, numbers); the others are the rows'
// own bytes (see batch: they outlive the commit).
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

func (p *pipeline) add(s *stmt, params ...[]byte) {
	p.stmts = append(p.stmts, pstmt{prep: s, sql: s.sql, params: params})
}

// addPlain queues a statement without parameters, sent as is.
func (p *pipeline) addPlain(sql string) { p.stmts = append(p.stmts, pstmt{sql: sql}) }

// hasDDL reports whether p holds an ALTER TABLE (see lane.send).
func (p *pipeline) hasDDL() bool {
	for _, s := range p.stmts {
		if s.prep == nil && len(s.sql) >= 11 && s.sql[:11] == "ALTER TABLE" {
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

// textArray encodes vals (nil: NULL) as a text[] literal into p's
// buffer: each value double-quoted, its quotes and backslashes escaped,
// so that no value (braces, commas, spaces, the word NULL) is read as
// anything but itself.
func (p *pipeline) textArray(n int, val func(i int) []byte) []byte {
	start := len(p.buf)
	p.buf = append(p.buf, '{')
	for i := range n {
		if i > 0 {
			p.buf = append(p.buf, ',')
		}
		v := val(i)
		if v == nil {
			p.buf = append(p.buf, "NULL"...)
			continue
		}
		p.buf = append(p.buf, '"')
		for _, c := range v {
			if c == '"' || c == '\\' {
				p.buf = append(p.buf, '\\')
			}
			p.buf = append(p.buf, c)
		}
		p.buf = append(p.buf, '"')
	}
	p.buf = append(p.buf, '}')
	return p.buf[start:len(p.buf):len(p.buf)]
}

// exec sends p on the lane's connection as one pipeline, one implicit
// transaction (all or nothing), in one round trip: the statements the
// connection has not prepared yet are prepared at its head (a restart at
// 1000 tables meets some 750 new statements a lane, which one round trip
// each would hold up for a second).
func (l *lane) exec(ctx context.Context, p *pipeline) error {
	pl := l.conn.PgConn().StartPipeline(ctx)
	var fresh []*stmt
	for _, s := range p.stmts {
		if s.prep == nil || s.prep.conn == l.connections {
			continue
		}
		if s.prep.name == "" {
			l.named++
			s.prep.name = "cdcflow_" + strconv.Itoa(l.n) + "_" + strconv.FormatUint(l.named, 10)
		}
		pl.SendPrepare(s.prep.name, s.prep.sql, nil)
		s.prep.conn = l.connections
		fresh = append(fresh, s.prep)
	}
	for _, s := range p.stmts {
		if s.prep != nil {
			pl.SendQueryPrepared(s.prep.name, s.params, nil, nil)
		} else {
			pl.SendQueryParams(s.sql, nil, nil, nil, nil)
		}
	}
	err := pl.Sync()
	if cerr := pl.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		// A statement prepared at the head of a pipeline that failed later
		// stays prepared (PostgreSQL's prepared statements are not
		// transactional), so the next try prepares it under a new name:
		// under its own, the retry of the tables one by one failed with
		// 42P05 (TestARefusedChangeFailsOnlyItsTable).
		for _, s := range fresh {
			s.name, s.conn = "", 0
		}
	}
	return err
}

// runInTransaction sends p's statements one by one, unprepared, in an
// explicit transaction: a pipeline prepares (parses) every statement
// before it runs any, and an upsert that names a column an ALTER TABLE
// before it adds would not parse.
func (l *lane) runInTransaction(ctx context.Context, p *pipeline) (err error) {
	pc := l.conn.PgConn()
	if _, err := pc.Exec(ctx, "BEGIN").ReadAll(); err != nil {
		return err
	}
	defer func() {
		if err != nil && !pc.IsClosed() {
			_, _ = pc.Exec(context.Background(), "ROLLBACK").ReadAll()
		}
	}()
	for _, s := range p.stmts {
		if _, err := pc.ExecParams(ctx, s.sql, s.params, nil, nil, nil).Close(); err != nil {
			return err
		}
	}
	_, err = pc.Exec(ctx, "COMMIT").ReadAll()
	return err
}

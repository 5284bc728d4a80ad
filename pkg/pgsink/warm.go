package pgsink

import (
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
)

// Warming a lane's statements before its first rows.
//
// A backend's first statement on a table builds the table's and its
// indexes' cache entries and plans, so a lane's first commit after a
// restart (about 250 tables at 1000, one upsert each) pays that for all of
// its tables at once. At a restart that time is idle: the stream has sent
// nothing while the walsender decodes again what the slot retains before
// its confirmed position, and the first rows' lane waits up to a second for
// more before it commits (flushInterval). So once the tables are bound, a
// lane with no commit due within warmMargin prepares each of its tables'
// upsert of a whole row (the statement of inserts and of updates that leave
// no column unchanged) and has the server plan it (EXPLAIN EXECUTE on empty
// arrays), a few tables at a time, behind the fence like any commit.
// Nothing runs: no row is written and no trigger fires (an empty INSERT
// would fire a table's statement triggers). The statement stays prepared
// for the rows, and the table's cache entries serve its other statements.

// warmChunk is how many tables one warm-up pipeline takes, and warmMargin
// how long before a commit is due a lane still starts one (about one
// chunk's time in the target): a commit falls due during one chunk at
// most, and waits for its end.
const (
	warmChunk  = 32
	warmMargin = 50 * time.Millisecond
)

// warmLockTimeout bounds each lock a warm-up pipeline waits for. Preparing
// an upsert takes its table's RowExclusiveLock until the pipeline ends, so
// a table that another session holds in a conflicting mode (an ALTER, a
// VACUUM FULL, a LOCK TABLE on the target) would hold the lane, and every
// table of it, in a warm-up of tables that may have no rows at all; the
// rows' own commits wait for such a lock as they must.
const warmLockTimeout = "100ms"

// warmMax is the most tables a lane warms: each is a statement prepared
// on its connection for good, which a lane with very many tables would
// pay for tables that may see no row for a long time.
const warmMax = 1024

// queueWarm gives the lane tables to warm (up to warmMax in all).
func (l *lane) queueWarm(ts []*table) {
	l.mu.Lock()
	defer l.mu.Unlock()
	room := warmMax - l.mu.warmed
	if room <= 0 {
		return
	}
	if len(ts) > room {
		ts = ts[:room]
	}
	l.mu.warmed += len(ts)
	l.mu.warm = append(l.mu.warm, ts...)
	l.ringLocked()
}

// warmSome warms the next chunk of the tables queued to warm, at now,
// unless a commit is due within warmMargin of it (deadline; zero: none
// due). A lane holding rows of a backlog waits up to a second for more
// before it commits (flushInterval): time it spends warming instead.
func (l *lane) warmSome(now, deadline time.Time) {
	l.mu.Lock()
	idle := len(l.mu.warm) == 0 || l.mu.closed || !warmAllowed(deadline, now)
	l.mu.Unlock()
	if idle {
		return
	}
	superseded := l.s.Err() != nil // not under mu: Err takes the sink's
	l.mu.Lock()
	if superseded {
		l.mu.warm = nil // nothing more is sent
	}
	n := min(len(l.mu.warm), warmChunk)
	ts := append([]*table(nil), l.mu.warm[:n]...)
	clear(l.mu.warm[:n])
	l.mu.warm = l.mu.warm[n:]
	l.mu.Unlock()
	warmed, err := l.app.warm(ts)
	switch f := classify(l.s.ctx.Err() != nil, err); f {
	case failNone:
		l.s.met.warmed.Add(float64(warmed))
	case failTable:
		// Nothing is lost: the rows' commits prepare what they need.
		l.s.met.warmFailures.Inc()
		l.s.log.Info("a lane stops warming its tables' statements: the target refused", zap.Int("lane", l.n), zap.Error(err))
		l.mu.Lock()
		l.mu.warm = nil
		l.mu.Unlock()
	default:
		l.settle(f, err)
	}
}

// warm prepares and plans the upsert of a whole row of each of ts that
// the lane's connection has not prepared yet (warmPipeline), and returns
// how many it sent.
func (a *applier) warm(ts []*table) (int, error) {
	var stmts []*stmt
	var explains []string
	for _, t := range ts {
		cols := make([]string, 0, len(t.rel.Columns))
		for _, c := range t.rel.Columns {
			if _, ok := t.types[c.Name]; !ok {
				cols = nil // the target lacks it: its first rows bring its DDL
				break
			}
			cols = append(cols, c.Name)
		}
		if len(cols) == 0 {
			continue
		}
		st := t.memo(formMany, false, cols, func() *stmt {
			return t.statement(strings.Join(cols, "\x00"), func() string { return t.upsertSQL(cols) })
		})
		if st.conn == a.connections {
			continue // a commit of its rows prepared it first
		}
		a.name(st)
		stmts = append(stmts, st)
		explains = append(explains, "EXPLAIN EXECUTE "+st.name+"("+strings.TrimSuffix(strings.Repeat("'{}', ", len(cols)), ", ")+")")
	}
	if len(stmts) == 0 {
		return 0, nil
	}
	return len(stmts), a.warmPipeline(stmts, explains)
}

// warmPipeline sends, in one pipeline behind the fence and under
// warmLockTimeout, each statement's Prepare and an EXPLAIN EXECUTE of it on
// empty arrays: the server plans
// it (its table's and indexes' cache entries built) and runs nothing, so
// no row is written and no trigger fires. The statements count as
// prepared on the lane's connection once it succeeded; on failure they are
// named anew (see exec).
func (a *applier) warmPipeline(stmts []*stmt, explains []string) error {
	pl := a.conn.PgConn().StartPipeline(a.s.ctx)
	pl.SendQueryParams(fenceSQL, [][]byte{a.owner, []byte(strconv.FormatInt(a.s.generation, 10))}, nil, nil, nil)
	// For the rest of the pipeline's transaction (the fence waits as long
	// as it must).
	pl.SendQueryParams("SELECT set_config('lock_timeout', $1, true)", [][]byte{[]byte(warmLockTimeout)}, nil, nil, nil)
	for i, st := range stmts {
		pl.SendPrepare(st.name, st.sql, nil)
		pl.SendQueryParams(explains[i], nil, nil, nil, nil)
	}
	err := pl.Sync()
	if cerr := pl.Close(); err == nil {
		err = cerr
	}
	for _, st := range stmts {
		if err == nil {
			st.conn = a.connections
		} else {
			st.name, st.conn = "", 0 // prepared or not, this name is spent
		}
	}
	return err
}

package pgsink

import (
	"strings"
	"time"

	"go.uber.org/zap"
)

// Warming a lane's statements before its first rows.
//
// A backend's first statement on a table builds the table's and its
// indexes' cache entries and plans: in a restart's drain at 1000 tables
// each lane's first commit (about 250 tables, one upsert each) spent 0.47
// s in the target where the next ones spent 0.03 to 0.07 s. At a restart
// that time is idle: the stream has sent nothing while the walsender
// decodes again what the slot retains before its confirmed position, and
// the first rows' lane waits up to a second for more before it commits
// (flushInterval). So once the tables are bound, a lane with no commit
// due within warmMargin prepares each
// of its tables' upsert of a whole row (the statement of inserts and of
// updates that leave no column unchanged) and runs it on no rows, a few
// tables at a time, behind the fence like any commit. It writes nothing;
// the statement stays prepared for the rows, and the table's cache
// entries serve its other statements.

// warmChunk is how many tables one warm-up pipeline takes (about 1 ms a
// table in the target), and warmMargin how long before a commit is due a
// lane still starts one: rows wait for a chunk at most that long.
const (
	warmChunk  = 32
	warmMargin = 50 * time.Millisecond
)

// warmMax is the most tables a lane warms: each is a statement prepared
// on its connection for good, which a lane with very many tables would
// pay for tables that may see no row for a long time.
const warmMax = 1024

// queueWarm gives the lane tables to warm (up to warmMax in all).
func (l *lane) queueWarm(ts []*table) {
	l.mu.Lock()
	defer l.mu.Unlock()
	room := warmMax - l.warmed
	if room <= 0 {
		return
	}
	if len(ts) > room {
		ts = ts[:room]
	}
	l.warmed += len(ts)
	l.warm = append(l.warm, ts...)
	l.ring()
}

// warmSome warms the next chunk of the tables queued to warm, at now,
// unless a commit is due within warmMargin of it (deadline; zero: none
// due). A lane holding rows of a backlog waits up to a second for more
// before it commits (flushInterval): time it spends warming instead.
func (l *lane) warmSome(now, deadline time.Time) {
	superseded := l.s.Err() != nil // before mu: Err takes the sink's
	l.mu.Lock()
	if superseded {
		l.warm = nil // nothing more is sent
	}
	if len(l.warm) == 0 || l.closed || !deadline.IsZero() && deadline.Sub(now) < warmMargin {
		l.mu.Unlock()
		return
	}
	n := min(len(l.warm), warmChunk)
	ts := append([]*table(nil), l.warm[:n]...)
	clear(l.warm[:n])
	l.warm = l.warm[n:]
	l.mu.Unlock()
	p := &l.pipe
	p.stmts, p.buf = p.stmts[:0], p.buf[:0]
	defer p.release()
	p.add(&l.fence, l.owner, p.int64Param(l.s.generation))
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
		if st.conn == l.connections {
			continue // a commit of its rows prepared it first
		}
		empty := make([][]byte, len(cols))
		for i := range empty {
			empty[i] = p.textArray(0, nil)
		}
		p.addArrays(st, empty...)
	}
	if len(p.stmts) == 1 {
		return // the fence alone
	}
	err := l.exec(l.s.ctx, p)
	if err == nil {
		l.s.met.warmed.Add(float64(len(p.stmts) - 1))
	} else if l.s.ctx.Err() == nil {
		// Nothing is lost: the rows' commits prepare what they need.
		l.s.log.Debug("warming a lane's statements failed", zap.Int("lane", l.n), zap.Error(err))
		l.mu.Lock()
		l.warm = nil
		l.mu.Unlock()
	}
}

package pgsource

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/cdcflow/eventservice/internal/pglink"
)

// The source's side tasks (the heartbeat, the publication poll, the slot
// statistics) share one control connection (connectControl: a walsender,
// never a regular client a smart shutdown waits for), one task at a time.
// Invariants: an error closes the connection and the next tick connects
// again; while the stream reports the source down, their failures are
// logged at debug (the stream logs the outage once).

// runHeartbeat writes a heartbeat message when no commit was decoded for
// HeartbeatInterval: an idle database's resolved-ts still advances, and
// the slot can move past WAL of tables that are not published.
func (s *Source) runHeartbeat() {
	s.everyTick(s.opts.HeartbeatInterval, 5*time.Second, "heartbeat", zap.DebugLevel, func(ctx context.Context, conn *pgx.Conn) error {
		if s.now().UnixNano()-s.lastCommit.Load() < int64(s.opts.HeartbeatInterval) {
			return nil
		}
		_, err := conn.Exec(ctx, "SELECT pg_logical_emit_message(true, $1, '')", heartbeatPrefix)
		return err
	})
}

// everyTick runs f every interval (on the source's clock) until Close,
// each within timeout, on the side connection the heartbeat and the poll
// share (sideConn): opened at the first tick that needs it and again after
// an error (logged at level), which closes it.
func (s *Source) everyTick(interval, timeout time.Duration, name string, level zapcore.Level, f func(ctx context.Context, conn *pgx.Conn) error) {
	t := s.opts.Clock.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C():
		}
		s.side.run(s, name, level, timeout, f)
	}
}

// sideConn is the connection the source's side tasks (the heartbeat, the
// publication poll) share, one at a time: a control connection
// (connectControl), so it never holds up a smart shutdown, and one WAL
// sender slot for both.
type sideConn struct {
	mu   sync.Mutex
	conn *pgx.Conn
}

// run runs f on the connection within timeout, connecting first if
// needed; an error is logged and closes the connection.
func (c *sideConn) run(s *Source, name string, level zapcore.Level, timeout time.Duration, f func(ctx context.Context, conn *pgx.Conn) error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn == nil {
		conn, err := connectControl(s.ctx, s.opts.DSN)
		if err != nil {
			s.log.Log(s.levelOf(err, level), name+": connect", zap.String("cause", pglink.Cause(err)))
			return
		}
		c.conn = conn
	}
	ctx, cancel := context.WithTimeout(s.ctx, timeout)
	err := f(ctx, c.conn)
	cancel()
	if err != nil && s.ctx.Err() == nil {
		s.log.Log(s.levelOf(err, level), name, zap.String("cause", pglink.Cause(err)))
		c.close()
	}
}

// close closes the connection, if open. REQUIRES: c.mu held, or the
// tasks stopped.
func (c *sideConn) close() {
	if c.conn != nil {
		c.conn.Close(context.Background())
		c.conn = nil
	}
}

// levelOf is the level a side task logs err at: level, unless err says
// the source itself is down (unreachable, shutting down, starting up),
// which the stream logs once for the outage (Source.link): then debug.
func (s *Source) levelOf(err error, level zapcore.Level) zapcore.Level {
	switch pglink.Classify(err) {
	case pglink.Unreachable, pglink.ShuttingDown, pglink.StartingUp, pglink.Terminated:
		return zapcore.DebugLevel
	}
	if down, _ := s.link.IsDown(); down {
		return zapcore.DebugLevel
	}
	return level
}

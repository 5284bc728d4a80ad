package pgsource

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

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
// each within timeout, on a connection of its own: opened at the first
// tick and again after an error (logged at level), which closes it.
func (s *Source) everyTick(interval, timeout time.Duration, name string, level zapcore.Level, f func(ctx context.Context, conn *pgx.Conn) error) {
	t := s.opts.Clock.NewTicker(interval)
	defer t.Stop()
	var conn *pgx.Conn
	defer func() {
		if conn != nil {
			conn.Close(context.Background())
		}
	}()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C():
		}
		if conn == nil {
			c, err := connect(s.ctx, s.opts.DSN)
			if err != nil {
				s.log.Log(level, name+": connect", zap.Error(err))
				continue
			}
			conn = c
		}
		ctx, cancel := context.WithTimeout(s.ctx, timeout)
		err := f(ctx, conn)
		cancel()
		if err != nil && s.ctx.Err() == nil {
			s.log.Log(level, name, zap.Error(err))
			conn.Close(context.Background())
			conn = nil
		}
	}
}

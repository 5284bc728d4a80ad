package pgsource

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"
)

// runHeartbeat writes a heartbeat message when no commit was decoded for
// HeartbeatInterval: an idle database's resolved-ts still advances, and
// the slot can move past WAL of tables that are not published.
func (s *Source) runHeartbeat() {
	t := s.opts.Clock.NewTicker(s.opts.HeartbeatInterval)
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
		if s.now().UnixNano()-s.lastCommit.Load() < int64(s.opts.HeartbeatInterval) {
			continue
		}
		if conn == nil {
			c, err := connect(s.ctx, s.opts.DSN)
			if err != nil {
				s.log.Debug("heartbeat: connect", zap.Error(err))
				continue
			}
			conn = c
		}
		ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
		_, err := conn.Exec(ctx, "SELECT pg_logical_emit_message(true, $1, '')", heartbeatPrefix)
		cancel()
		if err != nil {
			s.log.Debug("heartbeat", zap.Error(err))
			conn.Close(context.Background())
			conn = nil
		}
	}
}

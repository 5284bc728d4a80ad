package pgnotify

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/cdcflow/eventservice/internal/pgdial"
)

// connect opens a connection to dsn that notices a dead host (package
// pgdial): a publisher's statement or a listener's wait then fails within
// about half a minute, and the pump or the listener connects again, where
// pgconn's own dialer left them waiting for a quarter of an hour.
func connect(ctx context.Context, dsn string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	pgdial.Apply(&cfg.Config)
	return pgx.ConnectConfig(ctx, cfg)
}

package pgdial

import (
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// The probing of an idle connection (see the package's doc).
const (
	KeepAliveIdle     = 10 * time.Second
	KeepAliveInterval = 5 * time.Second
	KeepAliveCount    = 3
)

// Apply makes cfg dial with the keepalives above.
func Apply(cfg *pgconn.Config) {
	d := &net.Dialer{
		Timeout: cfg.ConnectTimeout,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: KeepAliveIdle, Interval: KeepAliveInterval, Count: KeepAliveCount,
		},
	}
	cfg.DialFunc = d.DialContext
}

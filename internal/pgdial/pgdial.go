package pgdial

import (
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// The probing: a dead peer fails a connection KeepAliveIdle +
// KeepAliveCount*KeepAliveInterval (25 s) after its last word while idle,
// and UserTimeout after data it did not acknowledge.
const (
	KeepAliveIdle     = 10 * time.Second
	KeepAliveInterval = 5 * time.Second
	KeepAliveCount    = 3
	UserTimeout       = 30 * time.Second
)

// Apply makes cfg dial with the keepalives and user timeout above.
func Apply(cfg *pgconn.Config) {
	d := &net.Dialer{
		Timeout: cfg.ConnectTimeout,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: KeepAliveIdle, Interval: KeepAliveInterval, Count: KeepAliveCount,
		},
		Control: setUserTimeout,
	}
	cfg.DialFunc = d.DialContext
}

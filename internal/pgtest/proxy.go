package pgtest

import (
	"testing"
	"time"

	"github.com/cdcflow/eventservice/internal/faultproxy"
)

// Proxy is a fault proxy in front of a server (package faultproxy).
type Proxy = faultproxy.Proxy

// StartProxy forwards a new loopback address to target, with delay added
// to each direction (delay 0: none).
func StartProxy(t testing.TB, target string, delay time.Duration) *Proxy {
	t.Helper()
	p := faultproxy.Start(t, target)
	p.SetDelay(delay)
	return p
}

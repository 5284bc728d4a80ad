//go:build !linux

package pgsource

import "net"

// hushOf returns nil: the linger's hush is for Linux's TCP, whose poll
// honours SO_RCVLOWAT (see hush_linux.go); elsewhere a linger lets the
// netpoller wake for what arrives meanwhile.
func hushOf(net.Conn) func(on bool) error { return nil }

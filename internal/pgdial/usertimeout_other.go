//go:build !linux

package pgdial

import "syscall"

// setUserTimeout does nothing: TCP_USER_TIMEOUT is Linux's; elsewhere the
// keepalives alone notice a dead peer.
func setUserTimeout(string, string, syscall.RawConn) error { return nil }

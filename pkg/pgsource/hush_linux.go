package pgsource

import (
	"math"
	"net"
	"syscall"
)

// hushOf returns the function that raises and lowers c's receive low-water
// mark (SO_RCVLOWAT), or nil if c is not a TCP socket. Raised, it asks for
// math.MaxInt32 bytes, which Linux caps at half of net.ipv4.tcp_rmem's
// largest buffer: TCP then wakes no reader until that much is queued (or
// its buffer nears full), and a read that does not block still returns
// whatever is queued. Raising it also grows the socket's receive buffer to
// hold the mark and clamps the window there, both at the sizes that
// autotuning would reach at most; lowering it to 1 (the default) wakes a
// waiting reader if anything is queued.
//
// Only TCP: a Unix socket's poll does not read the mark.
func hushOf(c net.Conn) func(on bool) error {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return nil
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return nil
	}
	return func(on bool) error {
		mark := 1
		if on {
			mark = math.MaxInt32
		}
		var serr error
		if err := raw.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, mark)
		}); err != nil {
			return err
		}
		return serr
	}
}

package pgsource

import (
	"net"
	"syscall"
)

// hushMark is the raised mark: four times what a linger lets arrive at
// the stream's rate (lingerBytes), so a linger is not cut short by it.
const hushMark = 4 * lingerBytes

// hushOf returns the function that raises and lowers c's receive low-water
// mark (SO_RCVLOWAT), or nil if c is not a TCP socket. Raised, it is
// hushMark: TCP then wakes no reader until that much is queued (or its
// buffer nears full), and a read that does not block still returns
// whatever is queued. Raising it also grows the socket's receive buffer to
// hold the mark (if smaller) and clamps the window there, which autotuning
// raises again as the stream needs: a mark at the kernel's largest
// (math.MaxInt32, capped at half of tcp_rmem's largest buffer) pinned the
// buffer at its largest and the window at half of it for the socket's
// life, out of autotuning's reach (found by review: a cap on a long link's
// catch-up). Lowering it to 1 (the default) wakes a waiting reader if
// anything is queued.
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
			mark = hushMark
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

package messaging

import "fmt"

// Target names a receiver: one event collector.
type Target string

// MaxTargetBytes bounds a target's name. Names become metric labels and
// log fields, and arrive from other processes, so they are checked
// (Target.Validate) before they are used.
const MaxTargetBytes = 128

// Validate reports why t is not a usable target name: empty, longer than
// MaxTargetBytes, or holding a byte outside [A-Za-z0-9._:@/-] (which also
// keeps it valid UTF-8, printable and safe as a Prometheus label value).
// Errors wrap ErrInvalidTarget.
func (t Target) Validate() error {
	switch {
	case t == "":
		return fmt.Errorf("%w: empty name", ErrInvalidTarget)
	case len(t) > MaxTargetBytes:
		return fmt.Errorf("%w: %d bytes, at most %d", ErrInvalidTarget, len(t), MaxTargetBytes)
	}
	for i := 0; i < len(t); i++ {
		if !targetByte(t[i]) {
			return fmt.Errorf("%w: byte %#x at %d (allowed: letters, digits and ._:@/-)", ErrInvalidTarget, t[i], i)
		}
	}
	return nil
}

func targetByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return c == '.' || c == '_' || c == ':' || c == '@' || c == '/' || c == '-'
}

// Transport carries messages from the event service to its targets.
//
// Send is all-or-nothing: it either accepts the whole of msgs (enqueued for
// the target, in order, behind everything accepted before) or none of them.
// It never blocks on a full queue. Errors:
//   - ErrBusy: refused for lack of room; normal back-pressure, retry later.
//   - ErrBatchTooLarge: the batch can never fit; split it. (InProcess says
//     so only of a batch beyond its Capacity in messages; one beyond its
//     byte bound is admitted alone into an empty queue.)
//   - ErrUnknownTarget, ErrClosed, ErrInvalidMessage (a nil element).
//   - anything wrapping ErrSendFailed: the transport failed; nothing of this
//     call was delivered.
//
// An empty msgs only checks the target. Implementations are safe for
// concurrent use; calls for one target from one goroutine are delivered in
// call order.
type Transport interface {
	Send(target Target, msgs []Message) error
}

// RoomNotifier is implemented by a Transport that can tell a sender it
// refused (ErrBusy) when the target has room again, so the sender waits
// for that instead of guessing a back-off: a busy target then costs a
// wakeup, not a timer.
type RoomNotifier interface {
	// Room returns a channel that is closed once target has room again:
	// at once if it has room now or is gone (unknown, unregistered,
	// closed: the next Send says why), otherwise when its receiver has
	// drained it down to half its capacity (InProcess: and, after a batch
	// was refused for its bytes, until it fits or the queue is empty, so a
	// refused oversized batch is not woken to be refused again). Each call may return a new
	// channel; a receiver that drains between a refusal and Room is seen,
	// so no wakeup is lost.
	Room(target Target) <-chan struct{}
	// HasRoom reports whether Room would return a closed channel now:
	// target is at or below half its capacity, or gone. A sender asks
	// before it does work whose only use is a Send (a scan reading rows),
	// so a full target costs it no work that a refusal would throw away;
	// it waits on Room instead. It never blocks and allocates nothing.
	HasRoom(target Target) bool
}

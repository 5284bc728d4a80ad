package messaging

// Target names a receiver: one event collector.
type Target string

// Transport carries messages from the event service to its targets.
//
// Send is all-or-nothing: it either accepts the whole of msgs (enqueued for
// the target, in order, behind everything accepted before) or none of them.
// It never blocks on a full queue. Errors:
//   - ErrBusy: refused for lack of room; normal back-pressure, retry later.
//   - ErrBatchTooLarge: the batch can never fit; split it.
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

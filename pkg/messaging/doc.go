// Package messaging defines the messages the event service sends to event
// collectors (Handshake, DMLBatch, DDL, Resolved, and ResolvedBatch, many
// dispatchers' Resolved in one message), the Transport they travel
// over, an in-process Transport (InProcess) and a fault-injecting wrapper
// (Faulty) for tests and the demo server; and the control plane the other
// way (ControlPlane: Register, a batched RegisterBatch, Reset, Remove and a
// batched Heartbeat), whose
// requests and replies are plain values and whose errors map to a Code, so
// that a collector can live in another process.
//
// Message semantics (enforced by the sender and checked by the receiver, not
// by the transport):
//   - Every message names its dispatcher, the dispatcher's registration (a
//     RegistrationID no earlier registration of the ID shares: a receiver
//     applies only its current registration's messages) and the epoch
//     within the registration, starting at 1. Each
//     epoch starts with a Handshake at Seq 1; every later DMLBatch and DDL
//     increments Seq by one; a Resolved carries the current Seq without
//     incrementing it. A receiver that sees a gap, a stale epoch or data
//     before the handshake resets the dispatcher.
//   - Within an epoch rows arrive in commit-ts order, a DDL after the DML of
//     its commit-ts, and resolved-ts never decreases nor passes rows not yet
//     sent.
//
// Transport invariants:
//   - Send is all-or-nothing: the whole slice is enqueued for the target, in
//     order, or none of it is. Accepted messages of one target are received
//     in the order they were accepted (FIFO per target).
//   - Send never blocks on a full queue: it refuses with ErrBusy, the normal
//     back-pressure signal; the caller keeps its progress, backs off and
//     retries. A transport that implements RoomNotifier (InProcess does)
//     also says when a refused target has room again, so the caller can
//     wait for that instead of guessing, and whether it has room now
//     (HasRoom), so the caller can wait before doing work a refusal
//     would waste. A batch that could never fit fails with ErrBatchTooLarge.
//   - Memory is bounded: an InProcess inbox holds at most Capacity messages
//     (a ResolvedBatch counts its entries: Weight) and, if set, MaxBytes
//     approximate bytes, or one oversized batch alone: a batch beyond
//     MaxBytes is admitted into an empty inbox, since a single row can be
//     far larger than any bound (a TOASTed value up to 1 GB) and refusing it
//     for good would stall its dispatcher for ever; while the inbox holds
//     others it is refused with ErrBusy, and Room waits until it fits or the
//     inbox is empty. The byte bound never yields ErrBatchTooLarge.
//   - Messages are passed by pointer, never copied: after a successful Send
//     the sender must not modify them. The msgs slice itself is not retained.
//     The one exception is a ResolvedBatch built with NewOwnedResolvedBatch:
//     its receiver calls Release once it no longer reads the entries, and
//     only then may their owner reuse them (a batch never released is
//     garbage collected; that costs only the reuse).
//   - Nothing here starts a goroutine or holds package-level state.
//
// Control-plane invariants: every request has a Validate (ErrInvalidRequest);
// a reply's errors are ErrInvalidRequest, ErrClosed, ErrUnavailable,
// ErrDispatcherExists, ErrUnknownDispatcher, ErrStaleRegistration,
// ErrStaleEpoch or ErrInternal, and CodeOf / Code.Err map each to a wire code
// and back; a heartbeat carries at most MaxHeartbeatCheckpoints entries, a
// register batch at most MaxRegisterBatch, and both are answered entry by
// entry.
//
// Every error wraps one of the sentinels in errors.go; test with errors.Is.
package messaging

// Package remote carries the event service's two planes over gRPC, so that
// collectors can run in other processes: the data plane (Handshake,
// DMLBatch, DDL, Resolved; service to collector) and the control plane
// (Register, Reset, Remove, batched Heartbeat; collector to service).
//
// Server is the service's end: a messaging.Transport and RoomNotifier whose
// targets are the collectors connected to it, and the server of a
// messaging.ControlPlane. Client is a collector's end: a ControlPlane whose
// calls go to the service, and a local messaging.Inbox that the stream
// fills, which the collector reads exactly as it reads an in-process one.
//
// The wire: frames in a compact binary encoding of the messages
// (wire.go) passed through gRPC by a codec that does no encoding of its
// own, so the module carries no generated code; one gRPC message per Send.
//
// Invariants:
//   - Send never blocks on the network: it encodes the batch and queues it
//     for the target's stream, or refuses. Flow control is by credit, in
//     messages: a collector opens its stream granting its inbox's free
//     capacity and grants more as the collector drains the inbox (once at
//     or below half). A Send beyond the credit is ErrBusy, and Room's
//     channel closes when the grants bring the credit back to half the
//     capacity, so a refused sender wakes on credit, not on a timer;
//     HasRoom says whether it is there now (the service's scans ask it
//     before they read).
//   - The service never has more messages in flight to a collector than
//     its inbox can take, so the client's forward into the inbox cannot be
//     refused (if it is, the peer broke the protocol and the stream ends).
//     Credit is tied to what was read (credit.go): each data frame carries
//     a mark (the stream's weight through it, tagged with a per-stream
//     key), each grant echoes the mark of the last frame read, and a Send
//     is accepted only within min(granted, acked+capacity), so accepted -
//     acked <= capacity whatever a peer grants; a mark the server did not
//     write ends the stream.
//   - A broken or replaced stream fails every later Send to the target
//     with ErrSendFailed and ErrUnavailable (the service backs off), until
//     the collector connects again; frames queued on it are dropped, and
//     the collector's per-dispatcher sequence checks see the gap.
//   - Control calls carry the messaging Codes: a sentinel error on one
//     side is the same sentinel on the other; a call that cannot reach the
//     service, or runs out of CallTimeout, is ErrUnavailable.
//   - Nothing from the wire is trusted: decoders check every count and
//     length against the bytes left before allocating (what a frame makes
//     the receiver allocate is bounded by a multiple of its size), targets
//     are validated before they become map keys or metric labels, the
//     server reads no frame larger than the largest valid request, caps a
//     collector's announced capacity, and bounds connections, streams per
//     connection and targets. Another wire version is refused naming both.
//   - Control requests arriving in part hold a bounded budget
//     (control_budget.go): each call is charged its stream window (static,
//     64 KiB) and, while read, the largest request, against
//     MaxControlBytesPerConnection and MaxControlBytesPerIP (a call that
//     cannot get its window is refused at once), and a request must arrive
//     whole within ControlReceiveTimeout of its call's start, or the call
//     ends and its charge is given back.
//   - Connections in their handshake (handshake.go) are bounded per address
//     (MaxHandshakesPerIP), in all (MaxHandshakes, taking the place of the
//     oldest of the address holding the most) and in time
//     (HandshakeTimeout from the accept, on the server's clock), so
//     connections that never handshake cannot keep a collector out.
//   - A peer acts only for its identity: with a Policy, a stream opens only
//     for a target the peer's certificate is granted, and control calls
//     carry its messaging.Authority for the control plane to check. A
//     refusal tells such a peer nothing of another identity's objects
//     (refusal.go): a Reset, Remove or heartbeat entry about another
//     target's registration is answered exactly as one about a dispatcher
//     that does not exist, and every explanation it gets is written from
//     the code and its own request, never from the service's text.
//     Without TLS the server listens on loopback only, unless allowed.
//   - A dead link is detected: each side pings when idle; a stream silent,
//     or with a send blocked, for LivenessTimeout is declared dead (the
//     server releases its frames and closes its connection; the client
//     redials), so a half-open link ends within 4/3 of LivenessTimeout.
//   - Goroutines: Server.Start starts the gRPC server; each stream runs its
//     handler (the watchdog), a writer and a reader, and the handler
//     returns only after its writer; Client.Start one stream loop and, per
//     stream, a credit granter and a watchdog. Close stops and waits for
//     all of them.
package remote

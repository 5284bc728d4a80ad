// Package eventcollector is the downstream side of the event service: what
// a changefeed server's dispatchers use to consume it. A Collector owns one
// target (one messaging.Inbox): it registers its dispatchers with the
// service, checks every message against its dispatcher's stream, applies
// rows and DDLs in order to a Sink, advances each dispatcher's checkpoint as
// resolved-ts proves rows applied, and heartbeats checkpoints to the service
// (which drive the store's GC).
//
// It meets the service only through messaging.ControlPlane (register,
// reset, remove, batched heartbeats: plain requests, typed errors), never
// as Go calls into the service: it depends on pkg/messaging and pkg/common
// alone, so it can live in another process.
//
// Registrations: every AddDispatcher is a new registration of the ID, with
// an identity (messaging.RegistrationID) the collector chooses, a random
// 64-bit base plus a counter, so no earlier registration of the ID shares
// it. Only messages carrying the current registration are applied; others
// (a table that moved away and back, whose old messages are still queued)
// are ignored and counted (reason stale_registration). RemoveDispatcher
// returns once the service's Remove (a fence: no send of the registration
// in progress or to come) returned and the dispatcher's sink call in
// flight, if any, ended. ForgetDispatchers (TakeOver only) drops many
// dispatchers' state with the same wait but no call to the service: their
// registrations again, in batches, take the service's old ones over (a
// reconnect re-registers a feed that way, not with a Remove per table).
//
// Receive rules, per dispatcher (the stream type; mirrors the strict checker
// of the service's tests, but reacts instead of recording):
//   - A message of another registration of the dispatcher is ignored and
//     counted, whatever its epoch and seq. A message of an epoch below the
//     current one is stale: ignored and counted. So is a message of a
//     dispatcher the collector does not have.
//   - The current epoch's handshake (seq 1), when none was received yet, is
//     accepted: the expected seq is 1 and resolved is its start-ts, which
//     must not exceed the start-ts asked for (rows would be skipped). The
//     sink hears BeginEpoch. DML batches and DDLs of the epoch are then
//     applied in order (Sink.ApplyRows, Sink.ApplyDDL); a batch with
//     Partial set leaves the epoch inside a split transaction until a batch
//     without it ends the transaction.
//   - A protocol violation resets the dispatcher: a message of a higher
//     epoch (reason epoch), anything before the handshake (before_handshake),
//     a second handshake (duplicate_handshake), a DML or DDL whose seq is not
//     expected+1 or a resolved-ts whose seq is above the expected one (gap),
//     a message messaging.Validate refuses, a row or DDL out of commit-ts
//     order or at or below the resolved-ts, a DDL inside a split transaction,
//     or a handshake above the start-ts asked for (invalid). A sink error
//     resets too (sink_error). A reset moves to a new epoch above every epoch seen,
//     with start-ts = the checkpoint, and calls the service's Reset; messages of
//     older epochs are ignored from then on. The sink sees rows above the
//     checkpoint again in the new epoch: deduplicate by (commit-ts, key).
//   - A resolved-ts whose seq is below the expected one is stale (rows with
//     later seqs were sent after it): ignored, not a reset. One at the
//     expected seq and above the resolved-ts raises it, and, unless the last
//     DML batch ended inside a split transaction, the sink's Checkpoint is
//     called with it and, once that returned nil, it is the dispatcher's
//     checkpoint. Checkpoints only move forward. With an AsyncSink the
//     checkpoint is the one the sink last reported durable (through the
//     function SetDurable gave it), so heartbeats and resets never count
//     what the sink only queued.
//   - A ResolvedBatch is its entries applied one after another, each as a
//     Resolved alone: each entry has its own verdict (one bad entry resets
//     only its dispatcher). The dispatcher is found by the slot the entry
//     echoes (the one AddDispatcher registered) when that slot holds the
//     ID the entry names, by ID otherwise; a batch of no or too many
//     entries is ignored and counted (invalid_batch). Once handled, the
//     batch is released (messaging.ResolvedBatch.Release): nothing of the
//     collector reads its entries after that, so the service may reuse them. Its verdicts are
//     taken under one lock, its sink calls made after it, in order (one
//     CheckpointBatch when the sink is a CheckpointBatcher and the batch
//     names each dispatcher once, each entry with the dispatcher's slot in
//     the collector, which a sink may index its state by, checking the
//     ID: MemorySink does); RemoveDispatcher of a dispatcher with a call
//     still to come waits for them.
//   - If the service's Reset says the epoch is stale (a concurrent reset won), the
//     local epoch goes one above and the reset is retried once; any other
//     failure keeps the dispatcher marked, and every heartbeat tick retries
//     until the service acknowledges (its Reset succeeds, or the new epoch's
//     handshake arrives). A recovery is never lost.
//
// Heartbeats: every HeartbeatInterval, every dispatcher whose checkpoint
// advanced since the service last accepted one is reported, with its
// registration and epoch, in one batched call (several past
// messaging.MaxHeartbeatCheckpoints); the service answers entry by entry. A
// stale-epoch answer is ignored (a reset is in flight) and the next tick
// reports again. Heartbeats run on their own goroutine, so a blocked sink
// does not hold back checkpoints already confirmed.
//
// Bounded memory and back-pressure: per-dispatcher state is O(1); the only
// buffer is one drained batch of at most MaxDrain messages. The sink is
// called from the receive goroutine only, so a slow sink stops the draining:
// the bounded inbox fills and the service's sends are refused with
// messaging.ErrBusy, which backs the service off and leaves the data in the
// store. Nothing grows in the collector.
//
// Lifecycle: New starts nothing; Start starts the receive and heartbeat
// goroutines; Close stops them, waiting for a sink call in flight (it cannot
// be interrupted; the loop checks for Close between messages). No goroutine
// survives Close. Errors wrap the sentinels in errors.go (or messaging's
// control-plane sentinels); test with errors.Is.
package eventcollector

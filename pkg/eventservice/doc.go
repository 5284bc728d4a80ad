// Package eventservice is the scan scheduler between the event store and
// the dispatchers' collectors: it decides, per dispatcher, when to read the
// store and when a progress-only message suffices, under bounded resources,
// without ever blocking the store's notification and without ever losing the
// last wakeup.
//
// Pipeline:
//
//	store notify -> Notify: advance the frontier (atomics), request
//	  -> per-worker preparation queue (a FIFO ring, one live entry per session)
//	  -> preparation worker, up to 8 sessions per pop: handshake |
//	     nothing | fast path | real scan (the resolved-only outcomes of a
//	     pop are added to the resolved set together, then published and
//	     ended, each session owned until its end)
//	  -> bounded scan channel -> scan worker: store rows + schema DDLs,
//	     merged by commit-ts, one all-or-nothing transport send
//	  -> progress published only after the transport accepted
//	resolved-only progress -> per-target pendingset (coalesced, batched,
//	  merged back on failure) -> transport
//
// The core: two pure functions decide everything a session does.
// transition (state.go) applies an event to the session's scheduling word,
// shared and fired by CAS; owner.step (core.go) applies an input
// (prepare, handshake_sent, scan_read, scan_sent) to the state only the
// owner touches and returns the effects to carry out, without I/O. The
// workers (carry.go) observe, step, carry the effects out and feed each
// send's result back. Store re-registration after a reset is control-plane
// work (Reset, then the registrar's retries), never a worker's. The
// traces in testdata/ drive both, and a whole unstarted service.
//
// Invariants:
//   - Notify never blocks: dispatcher.Notify does two atomic max-stores, one CAS on
//     the session's scheduling word and, at most, one push onto a
//     ring queue under a mutex no worker holds across work, plus a
//     non-blocking doorbell. It allocates nothing.
//   - Coalescing: a session is in at most one queue at a time (the
//     scheduling word says which). A request while queued is absorbed (the
//     work reads the latest frontier when it runs); a request while owned
//     (preparing or scanning) sets one pending follow-up. The preparation
//     queues hold at most one entry per dispatcher, whatever the rate.
//   - No lost wakeup: every exit of an owner either returns to idle with no
//     pending request, or re-enters the preparation queue (pending
//     follow-up, interrupted scan, back-off expiry, schema advance, reset).
//     The preparation queue never drops; the scan channel is entered by a
//     preparation worker that waits (watching Close), never by the notifier.
//   - One owner: only the holder of preparing or scanning reads or writes a
//     session's owner state (progress, back-off count); ownership passes
//     through the CAS, and only owner.step changes that state.
//   - Order: per session, messages leave in seq order from its single
//     owner: the handshake (seq 1), then DML batches in commit-ts order with
//     each commit-ts's DDLs after its rows, each DML/DDL taking the next
//     seq, and resolved-ts carrying the current seq, never ahead of the
//     rows sent.
//   - The store is the source of truth: progress advances only after the
//     transport accepted the messages; a refused send keeps progress, backs
//     the session off and re-reads from the store later.
//   - Schema frontier: rows are never read beyond the schema store's
//     resolved-ts; a session held by it parks and is re-queued when the
//     frontier passes, without a store notification.
//   - Control plane: the service implements messaging.ControlPlane
//     (Register, Reset, Remove, batched Heartbeat); its errors wrap
//     messaging's sentinels, which a network carries as codes.
//   - Registrations are identities: a dispatcher is one registration of an
//     ID (Register to Remove), named by the collector's RegistrationID in
//     every message header and control request. Requests of another
//     registration change nothing (messaging.ErrStaleRegistration).
//   - Remove is a fence: when it returns, no send of the registration is in
//     progress and none will start. Owners send under the dispatcher's
//     sendMu after checking the session is live, the pump under the
//     target's deliverMu after filtering out retired sessions; Remove takes
//     each once after retiring the session. Sends never block, so the wait
//     is one transport call at most.
//   - Lifecycle: a reset or remove retires the session (unlinked from every
//     queue; an owner discards its results); Close gates notifications,
//     unregisters from the store (waiting for in-flight callbacks), stops
//     the workers, then the pumps. No goroutine survives it. A dispatcher's
//     store registration is made and ended under its lock, after which it
//     is marked removed, so none outlives Remove or Close. A target lives
//     while it has dispatchers. Locks held across the embedder's code (the
//     store) are released by defer.
//   - Bounded memory: queues are bounded by dispatchers, the scan channel
//     by its size, a task by its limits, pending resolved-ts by dispatchers
//     per target; a small task's rows own their memory, so a message
//     waiting at a slow target pins at most about 8 times its rows.
package eventservice

// Package pgsource is a PostgreSQL logical replication source for the event
// store: an eventstore.Upstream whose subscriptions are whole tables, fed
// from one replication connection of a slot (pgoutput), decoded here
// (pglogrepl's decoders trust lengths; pgoutput.go checks every one).
//
// A commit gets the commit-ts max(previous + 2, commit time in ms << 18):
// strictly increasing in commit order, near the wall clock, and a function
// of the WAL and a seed position saved before its LSN is confirmed to the
// slot, so reading commits again from the slot (a restart, a dropped
// connection, a late subscription) gives them the same commit-ts and each
// subscription skips what it had. A new relation version is a DDL at the
// commit-ts minus one, before the rows that use it. A commit resolves the
// tables it wrote in the same push as their rows; the others advance every
// ResolvedInterval, and an idle database is advanced by heartbeats
// (pg_logical_emit_message). A large transaction goes to the store in
// chunks of ChunkRows; an initial snapshot is copied from the slot's
// exported snapshot before streaming from its consistent point. A table
// that joins while streaming (announced at its first change, or found by
// the publication's poll) is copied by CopyTable in chunks read between
// two watermarks the stream carries, the rows a change touched in between
// left to the stream (copy.go, copy_stream.go); a table without a key,
// in one chunk by what its snapshot saw (copy_keyless.go).
//
// A table without a key is replicated (pgcodec.Relation.Identity): under
// REPLICA IDENTITY FULL an update carries its whole old row and a delete
// every column; otherwise only its inserts and truncates are streamed, and
// a publication Open creates lists it in a companion that publishes only
// those (InsertsPublication), so that the source keeps allowing its
// updates and deletes (publication.go).
//
// Where the role is a superuser, Open installs a DDL capture (an event
// trigger writing a logical message in each CREATE, ALTER or DROP TABLE's
// own transaction, ddlcapture.go): the relation versions that follow carry
// the columns' numbers, which tell a rename from a drop and an add, and a
// dropped table is a DDL of its own. The session's first description of
// each subscribed table is a DDL even when it matches the version known.
//
// The stream's decisions are a WAL core (core.go; its rows in
// core_change.go, its positions in core_confirm.go; with copy_stream.go's
// windows and liveness.go): single-threaded and pure, stepped by parsed
// pgoutput messages, keepalives and ticks, returning actions (push rows or
// a resolved-ts, move the schema frontier, record a DDL, announce a table,
// finish a copy's chunk); each session (stream.go, decode.go) is the thin
// shell that reads the socket, looks up what the core needs (a relation's
// description in the catalog, the subscriptions, a watermark's chunk),
// steps it and carries the actions out. testdata/core traces it. The
// copy, the poll and the snapshot are its clients where they touch the
// stream: the copier registers chunks the core opens windows for, the
// poll announces tables the core then holds the slot before.
//
// The replication socket lingers (linger.go, ReadLinger): once a read found
// the socket drained, the next waits out the linger (real time) so that a
// stream keeping up reads bursts of messages, never more than about 128 KiB
// of them at the stream's rate; a stream that is behind never waits.
//
// Invariants: the slot's confirmed flush LSN moves only to a commit at or
// below SafePoint (what every dispatcher durably applied) and below every
// table announced but not yet subscribed, or to the server's WAL end once
// nothing decoded waits to be durable, and only after its position was
// saved (nextConfirm); no row is pushed twice to a subscription and none is
// skipped that it did not have; a subscription is never resolved past a
// commit it was not pushed (one that arrives after its session decoded such
// a commit waits for the replay its Subscribe asked for); a chunk of a copy pushes no row older than what the
// stream delivered for its key before its high watermark; a subscription
// from below what the slot retains is
// ErrStartTsTruncated, never rows invented; a message that does not decode
// stops the source (ErrProtocol). Goroutines: Start starts the stream (whose
// snapshot copy runs SnapshotWorkers more until it is done), the
// heartbeat, the publication's poll and the slot statistics; CopyTable
// runs on its caller's;
// Close stops them and waits. No package state.
package pgsource

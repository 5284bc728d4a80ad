// Package pgsink applies the changes of pkg/pgsource (in pkg/pgcodec's
// format) to a PostgreSQL database: an eventcollector.AsyncSink.
//
// Each dispatcher is one source table, bound to a target table of the same
// schema and name (created when missing, with the source's columns and
// key). Its calls are queued to one of Workers apply lanes (a lane owns a
// dispatcher for its life, so per-table order holds; different tables
// apply in parallel); a lane collects the queued work of many dispatchers
// and applies it in one transaction: per table the changes collapse to
// the last effect per key (an update that left a TOASTed column
// unchanged keeps the value an earlier change of the batch gave it, and
// the target's value otherwise), then deletes and upserts go out as
// batched statements over unnest'ed arrays (one or two rows as VALUES of
// text parameters, which cost the target less), and the dispatchers'
// checkpoints are written in the same transaction: one pipeline of
// statements the lane prepared itself, their parameters encoded by it
// (pipeline.go), the fence first. Once it commits, the
// lane reports those checkpoints durable to the collector, which
// heartbeats only durable checkpoints: a restart resumes exactly from
// what the target holds, and a replay re-applies harmlessly (upserts and
// deletes by key).
//
// A table without a key (pgcodec.Relation.Identity, keyless.go) gets its
// changes one by one in order, as PostgreSQL's subscriber does: plain
// inserts, and under REPLICA IDENTITY FULL updates and deletes of one row
// equal to the old row in every column (by the values' text). Its replay
// is made harmless by position: each commit writes, with its checkpoint
// row, the commit-ts and index of the last row applied, and a row at or
// before it is skipped.
//
// Schema changes (evolve.go): a relation DDL is compared with the version
// the table was last written by and the target changed to match before
// the rows that use it: columns added, dropped, renamed (by their numbers,
// or by place), retyped, the table renamed or moved, its key changed. One
// the target refuses, or that the versions cannot tell apart, stops that
// table: its calls are accepted and dropped, its checkpoint never advances
// (the slot keeps the WAL), cdcflow_pgsink_stopped_tables counts it and
// Stopped names it. The version each table was last written by is kept in
// the target with the DDL that made it (written.go), and a restart binds
// the table with it. A source table dropped drops its target table.
//
// Owners: a sink writes as an owner's generation (cdcflow.owners); Start
// raises the generation, waiting for every transaction of an earlier sink
// of the owner still on its way to commit, and every write transaction
// opens with cdcflow.fence, which fails once a later sink started (see
// fence.go). A superseded sink writes nothing more (Err, Superseded). The
// owner's wrote marker is set by a sink's first transaction that writes
// the target's tables and cleared by Reset (Wrote: the start-over rule).
//
// A lane is a thin goroutine (lane.go) around two parts. Its flush policy
// (policy.go) is pure: the calls it took and the time in, what is due out
// (when the held rows are committed: BatchRows or half the lane's share of
// QueueBytes, FlushInterval, stretched
// to MaxFlushInterval while far behind; when a checkpoint-only table is:
// every CheckpointInterval, at once while draining; whether a warm-up may
// start; when a refused table stops), traced from testdata/policy. Its
// applier (applier.go, commit.go, pipeline.go, warm.go) does the I/O: the
// commit's pipeline, the warm-up, the reconnect; a failed send's error is
// classified once (classify: the sink closing, superseded, the target
// lost, or the table's own fault) and carried out on one path, whether
// the commit held many tables, one table retried alone, or a warm-up.
//
// Invariants: no transaction of a sink commits after a later sink of its
// owner returned from Start; a dispatcher's work is applied in call order;
// a keyless table's row is applied once, whatever is replayed; a checkpoint
// is reported durable only after the transaction holding it and every row
// before it committed; a BeginEpoch discards what was queued and not
// committed for its dispatcher; memory is bounded by QueueRows queued rows
// per lane and by QueueBytes in bytes: the rows a lane holds, queued or
// taken and not committed (their keys' and values' bytes plus a row's
// own size), stay within its share, QueueBytes/Workers, but for one call
// into a lane that held nothing (which passes whatever its size, so that
// nothing waits forever), and a lane's commit falls due at half its share,
// so that no call waits for room only its own commit could free;
// a lost target costs no table anything (the work is kept and retried);
// only the table's own fault counts towards MaxFailures.
//
// Locking (the order at the top of Sink): Sink.startMu, then Sink.mu;
// Sink.adminMu, then Sink.mu or a lane's mu; Sink.mu and a lane's mu are
// leaves, never held across a wait on the target nor together. Start
// waits on the target (connect, the fence's wait of up to FenceWait)
// holding only startMu, which Close never takes: Close cancels those waits
// and returns at once.
//
// Goroutines: Start starts one per lane; Close stops them and waits.
// Test seams: testingKnobs (knobs.go), set by tests only.
package pgsink

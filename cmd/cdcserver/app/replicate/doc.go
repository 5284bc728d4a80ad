// Package replicate is cdcserver's long-running PostgreSQL-to-PostgreSQL
// changefeed (`cdcserver serve`) and its table comparison (`cdcserver
// compare`): a pgsource.Source feeds the event store, the event service
// and an in-process collector deliver to a pgsink.Sink, until SIGTERM.
//
// Invariants: the slot's confirmed flush LSN follows the lowest durable
// checkpoint of the sink (the slot is the durable log, the event store a
// cache wiped at start); a restart resumes every table from its own
// checkpoint in the sink; an initial snapshot that did not complete is
// started over (slot dropped, target tables truncated), never resumed
// with rows missing.
package replicate

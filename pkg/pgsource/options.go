package pgsource

import (
	"context"
	"regexp"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/optcheck"
	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

// SchemaSink receives relation versions as DDLs and the schema frontier
// (schemastore.Memory implements it).
type SchemaSink interface {
	AddDDL(d schemastore.DDL) error
	AdvanceResolvedTs(ts common.Ts) error
}

// Position pairs a WAL position with the commit-ts of the last commit at
// or before it: where the slot's stream resumes and the commit-ts chain
// it resumes from.
type Position struct {
	LSN uint64
	Ts  common.Ts
}

// PositionStore keeps positions durably, keyed by slot and LSN. The
// source saves a position before it confirms its LSN to the slot, so the
// slot's confirmed flush LSN always has one (TablePositions keeps them in
// a table of a PostgreSQL database, typically the sink's).
type PositionStore interface {
	Save(ctx context.Context, slot string, p Position) error
	// Load returns the position saved for lsn, if any.
	Load(ctx context.Context, slot string, lsn uint64) (Position, bool, error)
}

// Options configure a Source.
type Options struct {
	// DSN of the source database: a role with REPLICATION that may create
	// the publication. Required.
	DSN string
	// Slot and Publication name the logical replication slot and the
	// publication; both are created when missing (the publication listing
	// the tables Tables chooses: publication.go). Defaults "cdcflow".
	Slot, Publication string
	// ManagePublication: the publication is the changefeed's (it created
	// it): the poll keeps its list to what Tables chooses, adding tables
	// created or given a key later and taking out one that lost its key.
	// Default false: a publication the user made is read as it is.
	ManagePublication bool
	// Tables chooses the tables of a publication Open creates or the poll
	// manages (TableRule; empty: every table with a key).
	Tables TableRule
	// NoDDLCapture: Open never installs the DDL capture (ddlcapture.go),
	// which it does when the role is a superuser; one installed already
	// (by another changefeed) is still read.
	NoDDLCapture bool
	// Schema receives each new relation version as a DDL and the schema
	// frontier. Required.
	Schema SchemaSink
	// Positions keeps the slot's positions. Required.
	Positions PositionStore
	// SafePoint returns the commit-ts at or below which every dispatcher
	// of every changefeed has checkpointed (ok false: not known yet). The
	// slot's confirmed flush LSN follows it, never further. It is called
	// on the stream's goroutine at every status report (StatusInterval),
	// holding no lock of the source: it may call the source, but the stream
	// waits for it, so it must return at once (read a value kept up to
	// date elsewhere, as the sink's MinDurable does).
	SafePoint func() (ts common.Ts, ok bool)
	// OnNewTable, if set, is told of a published table that joined while
	// running (added to the publication, or created under one FOR ALL
	// TABLES) and a commit-ts to subscribe it from below: the commit-ts of
	// its first change, if the stream saw one first, or, if the
	// publication's poll found it first, the one after the last commit
	// decoded. The slot is held before it until the table is subscribed
	// from a start-ts below firstTs (which replays the stream from the slot
	// if it passed there). Its rows from before it joined are not in the
	// stream: CopyTable copies them. It is called on the stream's or the
	// poll's goroutine, holding no lock of the source, about once per
	// table (a restarted stream may announce again a table not yet
	// subscribed); the caller waits for it, so it should hand the table to
	// another goroutine and return (serve queues it for the goroutine that
	// binds, registers and copies new tables).
	OnNewTable func(rel pgcodec.Relation, firstTs common.Ts)
	// OnRejoin, if set, is told of a subscribed table that left the
	// publication and joined it again (found by the poll): its changes
	// while it was out are not in the stream, and CopyTable with fresh
	// copies it anew (the target emptied first, in the stream's order).
	// Called on the poll's goroutine; it should hand the table over and
	// return.
	OnRejoin func(rel pgcodec.Relation)
	// PublicationPollInterval is how often the publication's tables are
	// listed, to find the tables that joined it without a change since
	// (announced through OnNewTable). Default 10s; negative: off (a table
	// is then found at its first change).
	PublicationPollInterval time.Duration
	// CopyChunkRows is the rows of one chunk of CopyTable: what the stream
	// holds of a copy at a time, and the rows read between two
	// watermarks. Default 4096.
	CopyChunkRows int
	// KeylessCopyBytes bounds the values CopyTable holds of a table without
	// a key, which it reads in one chunk (copy_keyless.go); a larger one
	// is ErrKeylessTooLarge. Default 512 MiB.
	KeylessCopyBytes int
	// ResolvedInterval is how often every subscription's resolved-ts and
	// the schema frontier move to the last commit. A table's own commits
	// resolve it at once (each commit's push carries its commit-ts as the
	// resolved-ts of the tables it wrote), so this is the cadence of
	// tables without changes: how soon their checkpoints, and the slot,
	// follow. Default 1s (an idle table's checkpoint is written at most
	// once a second by pgsink anyway).
	ResolvedInterval time.Duration
	// ResolvedPushesPerSec bounds the pushes of those rounds a second
	// (one per subscription per round): with many tables the interval
	// grows to stay within it (100k tables: 10 s at the default). Default
	// 10000.
	ResolvedPushesPerSec int
	// HeartbeatInterval: when no commit was decoded for this long the
	// source writes a heartbeat (pg_logical_emit_message) so that an idle
	// database's resolved-ts and the slot still advance. Default 1s.
	HeartbeatInterval time.Duration
	// StatusInterval is how often the source reports its position to the
	// server. Default 1s.
	StatusInterval time.Duration
	// SlotStatsInterval is how often the slot's statistics are read
	// (SlotStats, the cdcflow_pgsource_slot_* metrics). Default 10s.
	SlotStatsInterval time.Duration
	// ChunkRows bounds the rows of one transaction held per table before
	// they are pushed to the store: a large transaction is spilled to the
	// store in chunks, never held whole. Default 1024.
	ChunkRows int
	// TakeOver: Open terminates a walsender still attached to the slot
	// and waits for it to exit before it reads where to resume (the slot's
	// confirmed flush LSN moves until the walsender has read its client's
	// last status report). For an embedder that has already fenced out
	// the slot's earlier user, as serve does with the sink's owner fence.
	// Without it Open waits up to 10 s for the walsender to leave, then
	// fails with ErrSlotInUse.
	TakeOver bool
	// SnapshotWorkers copy tables of the initial snapshot in parallel.
	// Default 2.
	SnapshotWorkers int
	// ReadLinger: once the replication stream has drained the socket's
	// receive queue, its next read waits until this much real time has
	// passed since, so that a stream keeping up with a live load reads a
	// batch of messages per read instead of one (linger.go says why); a
	// stream that is behind never waits. It adds at most this to the
	// latency of a message. Default DefaultReadLinger; negative: off.
	ReadLinger time.Duration
	// ReceiveTimeout: a replication stream that has heard nothing from the
	// server for half of it asks for a reply (a status report with
	// reply requested, which a live walsender answers at once, idle or
	// not), and one that has still heard nothing for the other half ends
	// with ErrSourceSilent and connects again, as PostgreSQL's own
	// wal_receiver_timeout does: a link that died without a word (a
	// partition, a host gone, a walsender stuck) is noticed instead of
	// waited on. Default DefaultReceiveTimeout; negative: off.
	ReceiveTimeout time.Duration
	// Logger defaults to zap.NewNop(); Clock to the real clock.
	Logger *zap.Logger
	Clock  clock.Clock
	// Registerer, if set, receives the source's metrics (cdcflow_pgsource_*).
	Registerer prometheus.Registerer
}

// DefaultReadLinger is Options.ReadLinger's default.
const DefaultReadLinger = 20 * time.Millisecond

// DefaultReceiveTimeout is Options.ReceiveTimeout's default, PostgreSQL's
// wal_receiver_timeout's.
const DefaultReceiveTimeout = time.Minute

var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// EnsureDefaults returns o with its zero fields set to their documented
// defaults.
func (o Options) EnsureDefaults() Options {
	if o.Slot == "" {
		o.Slot = "cdcflow"
	}
	if o.Publication == "" {
		o.Publication = "cdcflow"
	}
	if o.ResolvedInterval == 0 {
		o.ResolvedInterval = time.Second
	}
	if o.ResolvedPushesPerSec == 0 {
		o.ResolvedPushesPerSec = 10000
	}
	if o.HeartbeatInterval == 0 {
		o.HeartbeatInterval = time.Second
	}
	if o.StatusInterval == 0 {
		o.StatusInterval = time.Second
	}
	if o.SlotStatsInterval == 0 {
		o.SlotStatsInterval = 10 * time.Second
	}
	if o.ChunkRows == 0 {
		o.ChunkRows = 1024
	}
	if o.PublicationPollInterval == 0 {
		o.PublicationPollInterval = 10 * time.Second
	}
	if o.CopyChunkRows == 0 {
		o.CopyChunkRows = 4096
	}
	if o.KeylessCopyBytes == 0 {
		o.KeylessCopyBytes = 512 << 20
	}
	if o.SnapshotWorkers == 0 {
		o.SnapshotWorkers = 2
	}
	if o.ReadLinger == 0 {
		o.ReadLinger = DefaultReadLinger
	}
	if o.ReceiveTimeout == 0 {
		o.ReceiveTimeout = DefaultReceiveTimeout
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	o.Clock = clock.OrReal(o.Clock)
	if o.SafePoint == nil {
		o.SafePoint = func() (common.Ts, bool) { return 0, false }
	}
	return o
}

// Validate reports every bad field of the defaulted options at once,
// wrapped in ErrInvalidOptions.
func (o Options) Validate() error {
	p := optcheck.New(ErrInvalidOptions)
	p.Require(o.DSN != "", "DSN is required")
	p.Required("Schema", o.Schema)
	p.Required("Positions", o.Positions)
	p.NotTypedNil("Registerer", o.Registerer)
	p.Require(identRE.MatchString(o.Slot), "Slot %q: lower-case letters, digits and _ (a replication slot name)", o.Slot)
	if err := o.Tables.Validate(); err != nil {
		p.Addf("Tables: %v", err)
	}
	p.Require(identRE.MatchString(o.Publication), "Publication %q: lower-case letters, digits and _", o.Publication)
	p.Require(o.ResolvedInterval > 0 && o.HeartbeatInterval > 0 && o.StatusInterval > 0 && o.SlotStatsInterval > 0, "intervals must be positive")
	p.IntRange("ChunkRows", o.ChunkRows, 1, 1<<20)
	p.IntRange("ResolvedPushesPerSec", o.ResolvedPushesPerSec, 1, 1<<30)
	p.IntRange("SnapshotWorkers", o.SnapshotWorkers, 1, 64)
	p.IntRange("CopyChunkRows", o.CopyChunkRows, 1, 1<<20)
	p.IntRange("KeylessCopyBytes", o.KeylessCopyBytes, 1, 1<<40)
	p.Require(o.ReadLinger <= time.Second, "ReadLinger %v must be at most 1s", o.ReadLinger)
	p.Require(o.ReceiveTimeout < 0 || o.ReceiveTimeout >= 100*time.Millisecond,
		"ReceiveTimeout %v must be at least 100ms (or negative: off)", o.ReceiveTimeout)
	return p.Err()
}

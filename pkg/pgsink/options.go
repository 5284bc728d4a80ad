package pgsink

import (
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/optcheck"
	"github.com/cdcflow/eventservice/pkg/clock"
)

// Defaults of Options' intervals.
const (
	DefaultFlushInterval      = 100 * time.Millisecond
	DefaultMaxFlushInterval   = time.Second
	DefaultCheckpointInterval = time.Second
)

// DefaultQueueBytes is Options.QueueBytes' default: 64 MiB a sink, 16 MiB
// a lane of the default four (docs/benchmarks.md, "A node's memory per
// changefeed": rows of 1 kB still commit BatchRows at a time under it).
const DefaultQueueBytes = 64 << 20

// MinLaneQueueBytes is the least share of Options.QueueBytes a lane may
// have, MaxQueueBytes the most QueueBytes may be.
const (
	MinLaneQueueBytes = 64 << 10
	MaxQueueBytes     = 1 << 40
)

// Options configure a Sink. A zero field takes the default its comment
// gives (EnsureDefaults); New fills them in and validates (Validate),
// reporting every bad field at once.
type Options struct {
	// DSN of the target database. Required.
	DSN string
	// Workers is the number of apply lanes, each with its own connection.
	// Default 4.
	Workers int
	// BatchRows: a lane commits once it holds this many rows. Default
	// 5000.
	BatchRows int
	// FlushInterval: a lane commits the rows it holds at least this
	// often. Default 100ms.
	FlushInterval time.Duration
	// MaxFlushInterval: while the rows a lane holds are far behind (their
	// newest commit more than four MaxFlushIntervals before the lane's
	// last commit), the lane commits this often instead of FlushInterval,
	// so that a backlog is applied in larger statements; but FlushInterval
	// after rows stopped arriving at the latest. Default 1s (or
	// FlushInterval, if larger); FlushInterval turns the stretching off.
	MaxFlushInterval time.Duration
	// CheckpointInterval: a dispatcher whose work is checkpoints only (an
	// idle table's resolved-ts) is written at least and at most this
	// often; one with rows is written with its rows. Default 1s.
	CheckpointInterval time.Duration
	// QueueRows bounds the rows queued per lane; ApplyRows blocks beyond
	// it (back-pressure). Default 20000.
	QueueRows int
	// QueueBytes bounds the bytes of rows the sink holds in memory: queued
	// and taken by a lane but not yet committed, each row counted as its
	// key's and values' bytes plus rowOverhead (a DDL as its text). It is
	// split evenly among the lanes, each of which holds at most its share
	// (QueueBytes/Workers): ApplyRows and ApplyDDL block beyond it
	// (back-pressure, as QueueRows), but a call into a lane that holds
	// nothing passes whatever its size, and a lane's commit is due once it
	// holds half its share, so that the rows it holds never pin the
	// budget. With QueueRows it bounds what a changefeed holds whatever
	// its rows' width (a row count alone let 20000 rows of 1 MB TOASTed
	// values hold 20 GB). At least 64 KiB per lane. Default
	// DefaultQueueBytes.
	QueueBytes int64
	// MaxFailures: a table whose transaction the target refuses this many
	// times in a row is stopped. Default 5.
	MaxFailures int
	// Owner names the changefeed in the target (cdcflow.owners). Start
	// fences out every earlier sink of the same owner: it waits for their
	// transactions still on their way to commit, and any they try later
	// fails (fence.go), so a sink that died or was paused never writes
	// after its successor started. Two sinks of one owner never write
	// at once: the later one wins, the earlier one stops (Err). At most
	// 63 bytes of UTF-8 without NUL. Default "default".
	Owner string
	// SoleOwner: Start refuses a target whose cdcflow.owners lists
	// another owner (ErrAnotherOwner), before it writes anything there:
	// the target's checkpoints and state are then one owner's, which a
	// Reset or ClearProgress may clear whole. Default false.
	SoleOwner bool
	// Source identifies the source database the owner replicates (an
	// opaque key: serve's is the source's system identifier and database
	// OID). The first Start of an owner records it; a later Start with
	// another one is refused (ErrOtherSource) before it writes anything.
	// Default "": neither recorded nor checked.
	Source string
	// FenceWait bounds Start's wait for an earlier sink's open
	// transactions (ErrConnect after it). Default 1m: a lane's
	// connection that lost its client ends within 30 s
	// (idle_in_transaction_session_timeout) once its pipeline is done.
	FenceWait time.Duration
	// EndFenceHolders: when FenceWait passes with an earlier sink's
	// transaction still open, Start ends the target backends holding the
	// owner's fence (pg_terminate_backend) and takes it, rather than fail:
	// a sink whose process was frozen or cut off inside a transaction
	// cannot hold a take-over beyond FenceWait. Its transaction rolls
	// back (none of its rows committed). A cluster's node sets it, with
	// its own FenceWait. Default false: Start fails (ErrConnect).
	EndFenceHolders bool
	// Permit, if set, is asked right before every transaction the sink
	// sends to the target (a lane's commit, a state write, a reset): an
	// error refuses it, and the sink writes nothing more, as if
	// superseded (Err wraps ErrNotPermitted). A node of a cluster gives
	// its membership's validity, so that it sends no transaction once its
	// lease could have expired. Default nil: every write is permitted.
	Permit func() error
	// Logger defaults to zap.NewNop(); Clock (the lanes' flush and
	// checkpoint cadence, the reconnect back-off) to the real clock.
	Logger *zap.Logger
	Clock  clock.Clock
	// Registerer, if set, receives the sink's metrics (cdcflow_pgsink_*).
	Registerer prometheus.Registerer
}

// laneBytes is a lane's share of QueueBytes.
func (o Options) laneBytes() int64 { return o.QueueBytes / int64(o.Workers) }

// EnsureDefaults fills zero fields with their defaults (New calls it).
func (o Options) EnsureDefaults() Options {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.Workers, 4)
	def(&o.BatchRows, 5000)
	def(&o.QueueRows, 20000)
	def(&o.MaxFailures, 5)
	if o.QueueBytes == 0 {
		o.QueueBytes = DefaultQueueBytes
	}
	if o.FlushInterval == 0 {
		o.FlushInterval = DefaultFlushInterval
	}
	if o.MaxFlushInterval == 0 {
		o.MaxFlushInterval = max(DefaultMaxFlushInterval, o.FlushInterval)
	}
	if o.CheckpointInterval == 0 {
		o.CheckpointInterval = DefaultCheckpointInterval
	}
	if o.Owner == "" {
		o.Owner = "default"
	}
	if o.FenceWait == 0 {
		o.FenceWait = time.Minute
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	o.Clock = clock.OrReal(o.Clock)
	return o
}

// Validate reports every invalid field at once, each wrapping
// ErrInvalidOptions. It expects defaults filled in (EnsureDefaults): a zero
// field is not taken for its default here.
func (o Options) Validate() error {
	p := optcheck.New(ErrInvalidOptions)
	p.Require(o.DSN != "", "DSN is required")
	p.IntRange("Workers", o.Workers, 1, 256)
	p.IntRange("BatchRows", o.BatchRows, 1, 1<<20)
	p.IntRange("QueueRows", o.QueueRows, o.BatchRows, 1<<24)
	p.Require(o.QueueBytes >= int64(o.Workers)*MinLaneQueueBytes && o.QueueBytes <= MaxQueueBytes,
		"QueueBytes %d must be at least 64 KiB per lane (Workers %d) and at most 1 TiB", o.QueueBytes, o.Workers)
	p.IntRange("MaxFailures", o.MaxFailures, 1, 1000)
	p.Require(o.FlushInterval > 0, "FlushInterval must be positive")
	p.Require(o.MaxFlushInterval >= o.FlushInterval, "MaxFlushInterval %v must be at least FlushInterval %v", o.MaxFlushInterval, o.FlushInterval)
	p.Require(o.CheckpointInterval > 0, "CheckpointInterval must be positive")
	p.Require(len(o.Owner) <= 63 && utf8.ValidString(o.Owner) && !strings.ContainsRune(o.Owner, 0),
		"Owner must be at most 63 bytes of UTF-8 without NUL")
	p.Require(o.FenceWait >= time.Millisecond, "FenceWait must be at least 1ms")
	p.NotTypedNil("Registerer", o.Registerer)
	p.NotTypedNil("Clock", o.Clock)
	return p.Err()
}

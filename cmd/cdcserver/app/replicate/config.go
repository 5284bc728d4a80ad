package replicate

import (
	"context"
	"errors"
	"flag"
	"net"
	"strings"
	"time"

	"github.com/cdcflow/eventservice/cmd/cdcserver/app/goruntime"
	"github.com/cdcflow/eventservice/internal/optcheck"
	"github.com/cdcflow/eventservice/pkg/pgsink"
	"github.com/cdcflow/eventservice/pkg/pgsource"
)

// ErrInvalidConfig wraps every configuration error.
var ErrInvalidConfig = errors.New("invalid configuration")

// Config is serve's configuration; each exported field is one flag.
type Config struct {
	Source, Sink      string
	Slot, Publication string
	DataDir           string
	MetricsAddr       string
	PprofAddr         string
	LogFormat         string
	LogLevel          string
	ProgressInterval  time.Duration
	ReadyLag          time.Duration
	SinkWorkers       int
	// SourceReadLinger is pgsource.Options.ReadLinger (0: off).
	SourceReadLinger time.Duration
	// SourceReceiveTimeout is pgsource.Options.ReceiveTimeout (0: off).
	SourceReceiveTimeout time.Duration
	// PublicationPollInterval is pgsource.Options.PublicationPollInterval
	// (0: off).
	PublicationPollInterval time.Duration
	// SinkFlushInterval is how often a sink lane commits the rows it
	// holds, SinkMaxFlushInterval how far a lane stretches that while its
	// rows are far behind; SinkCheckpointInterval how often an idle
	// table's checkpoint is written (pgsink.Options).
	SinkFlushInterval      time.Duration
	SinkMaxFlushInterval   time.Duration
	SinkCheckpointInterval time.Duration
	// SinkQueueSize bounds the bytes of rows the sink holds in memory,
	// queued and not yet committed (pgsink.Options.QueueBytes): a
	// changefeed's in-flight rows, whatever their width.
	SinkQueueSize int64
	// Settings are the Go runtime's (--gc-percent, --max-procs,
	// --memory-limit) while serving; a set environment variable wins.
	goruntime.Settings
	// ShutdownTimeout bounds a clean stop.
	ShutdownTimeout time.Duration
	// MaxRetainedWAL bounds the WAL the slot may retain while stopped
	// tables hold it back: past it they let go (wal.go). 0: no bound.
	MaxRetainedWAL int64
	// Include and Exclude choose the tables of a publication serve
	// creates (pgsource.TableRule: schema.table globs).
	Include, Exclude patternList
	// NoDDLCapture: never install the source's DDL capture
	// (pgsource.Options.NoDDLCapture).
	NoDDLCapture bool

	// loopInterval is how often serve checks its fence and its source
	// and records the snapshot's completion (0: a second); no flag, tests
	// set it.
	loopInterval time.Duration
	// copySettleInterval is how often the copier takes off its list the
	// copies the target holds durably (0: a second); no flag, tests set
	// it.
	copySettleInterval time.Duration
	// copyChunkRows is pgsource.Options.CopyChunkRows (0: its default);
	// no flag, tests set it so that small tables span many chunks.
	copyChunkRows int
	// slotStatsInterval is pgsource.Options.SlotStatsInterval (0: its
	// default); no flag, tests set it.
	slotStatsInterval time.Duration
	// stopKnobs let a test hold a clean stop's steps (nil: none).
	stopKnobs *stopKnobs
	// embedding is what RunEmbedded was given (nil: serve's own run).
	embedding *Embedding
}

// stopKnobs are a test's hooks into a clean stop, so that it can make each
// step take as long as it likes: quiesce runs in place of the source's
// quiesce, with its context (bounded by the step's share of
// ShutdownTimeout); closing runs first in close's goroutine and closed last.
type stopKnobs struct {
	quiesce func(ctx context.Context) error
	closing func()
	closed  func()
}

// DefaultMaxRetainedWAL is --max-retained-wal's default: 10 GiB, far above
// what a changefeed that keeps up retains (its restart point lags by up to
// two of the server's 15 s running-xacts intervals) and below a disk a
// production server would let fill.
const DefaultMaxRetainedWAL = 10 << 30

// patternList is a flag of comma-separated table patterns.
type patternList []string

func (l *patternList) String() string { return strings.Join(*l, ",") }

func (l *patternList) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*l = append(*l, p)
		}
	}
	return nil
}

// permit is the embedding's write permit (nil: serve's own run).
func (c Config) permit() func() error {
	if c.embedding == nil {
		return nil
	}
	return c.embedding.Permit
}

// fenceWait is the embedding's FenceWait (0: serve's own run).
func (c Config) fenceWait() time.Duration {
	if c.embedding == nil {
		return 0
	}
	return c.embedding.FenceWait
}

// tableRule is the rule the flags give.
func (c Config) tableRule() pgsource.TableRule {
	return pgsource.TableRule{Include: c.Include, Exclude: c.Exclude}
}

// DefaultConfig returns serve's defaults.
func DefaultConfig() Config {
	return Config{Slot: "cdcflow", Publication: "cdcflow", MetricsAddr: "127.0.0.1:9464", PprofAddr: "127.0.0.1:0",
		LogFormat: "text", LogLevel: "info", ProgressInterval: 5 * time.Second, ReadyLag: 30 * time.Second,
		SinkWorkers: 4, SinkFlushInterval: pgsink.DefaultFlushInterval, SinkMaxFlushInterval: pgsink.DefaultMaxFlushInterval,
		SinkCheckpointInterval: pgsink.DefaultCheckpointInterval, SinkQueueSize: pgsink.DefaultQueueBytes, SourceReadLinger: pgsource.DefaultReadLinger, SourceReceiveTimeout: pgsource.DefaultReceiveTimeout, PublicationPollInterval: 10 * time.Second, Settings: goruntime.Settings{GCPercent: 300},
		ShutdownTimeout: 30 * time.Second, MaxRetainedWAL: DefaultMaxRetainedWAL}
}

// BindFlags registers every field on fs.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Source, "source", c.Source, "the source database: postgres://user@host:port/db (wal_level=logical; a role with REPLICATION)")
	fs.StringVar(&c.Sink, "sink", c.Sink, "the target database: postgres://user@host:port/db (tables are created there; checkpoints in schema cdcflow)")
	fs.StringVar(&c.Slot, "slot", c.Slot, "the logical replication slot (created when missing)")
	fs.StringVar(&c.Publication, "publication", c.Publication, "the publication (created when missing, listing the tables with a key that the role owns: --include, --exclude)")
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "directory for the event store, a cache wiped at start (default: a temporary directory)")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", c.MetricsAddr, "address serving /metrics, /healthz and /readyz (empty: none)")
	fs.StringVar(&c.PprofAddr, "pprof-addr", c.PprofAddr, "loopback address serving /debug/pprof (empty: none)")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "log format: text or json")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "log level: debug, info, warn or error")
	fs.DurationVar(&c.ProgressInterval, "progress-interval", c.ProgressInterval, "period of the progress line on stderr (0 = none)")
	fs.DurationVar(&c.ReadyLag, "ready-lag", c.ReadyLag, "/readyz fails while the oldest change decoded from the source has waited longer than this to be applied on the target (the lag)")
	fs.IntVar(&c.SinkWorkers, "sink-workers", c.SinkWorkers, "parallel apply lanes (connections) to the target")
	fs.DurationVar(&c.SinkFlushInterval, "sink-flush-interval", c.SinkFlushInterval, "how often a lane commits the rows it holds, each table's checkpoint with its rows (one transaction per lane)")
	fs.DurationVar(&c.SinkMaxFlushInterval, "sink-max-flush-interval", c.SinkMaxFlushInterval, "while a lane's rows are more than four times this behind (a backlog), it commits this often instead of every --sink-flush-interval (at least that; equal to it: no stretching)")
	fs.DurationVar(&c.SinkCheckpointInterval, "sink-checkpoint-interval", c.SinkCheckpointInterval, "how often the checkpoint of a table without new rows is written (its resolved-ts advance)")
	fs.Var((*goruntime.ByteSize)(&c.SinkQueueSize), "sink-queue-size", "a `size` (64MiB; B, KiB, MiB, GiB, TiB; at least 64KiB per --sink-workers lane): the rows the sink holds in memory, "+
		"queued and not yet committed, in bytes (their values plus about 100 bytes a row), split among its lanes; the source's stream waits beyond it. A lane commits once it holds half its share")
	fs.DurationVar(&c.SourceReceiveTimeout, "source-receive-timeout", c.SourceReceiveTimeout, "a replication stream that hears nothing from the source for half of this asks for a reply, and one that still hears nothing by its end connects again (PostgreSQL's wal_receiver_timeout; 0 = off; at least 1s)")
	fs.DurationVar(&c.SourceReadLinger, "source-read-linger", c.SourceReadLinger, "once the replication stream has read all the source sent, its next read waits this long so that messages arrive in batches rather than one per read (0 = off; at most 1s): fewer wake-ups per row while it keeps up, at most this much more latency")
	fs.DurationVar(&c.PublicationPollInterval, "publication-poll-interval", c.PublicationPollInterval, "how often the publication's tables are listed to find the ones that joined it (ALTER PUBLICATION ... ADD TABLE) without a change since; each table that joins is copied, its rows then streamed (0 = off: a table is found at its first change, and copied then)")
	c.Settings.BindFlags(fs, "serve")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", c.ShutdownTimeout, "how long a clean stop may take")
	fs.Var(&c.Include, "include", "for a publication serve creates: the tables to replicate, `patterns` (comma-separated schema.table globs: public.*,sales.orders); default every table with a key")
	fs.Var(&c.Exclude, "exclude", "for a publication serve creates: the tables left out, `patterns` (comma-separated schema.table globs: public.audit_*)")
	fs.BoolVar(&c.NoDDLCapture, "no-ddl-capture", c.NoDDLCapture, "never install the DDL capture on the source (an event trigger, installed when the source role is a superuser, "+
		"that tells a renamed column from a dropped and added one and carries DROP TABLE); without it such changes stop their table")
	fs.Var((*goruntime.ByteSize)(&c.MaxRetainedWAL), "max-retained-wal", "a `size` (10GiB; B, KiB, MiB, GiB, TiB): once the slot retains more WAL than this, "+
		"tables stopped by a change the target cannot apply let go of it (their checkpoint dropped, logged at ERROR, a fresh copy owed at the next start) "+
		"so that the source's WAL stops growing for them; 0 = no bound (PostgreSQL's max_slot_wal_keep_size still applies)")
}

// Validate reports every invalid field at once.
func (c Config) Validate() error {
	p := optcheck.New(ErrInvalidConfig)
	p.Require(c.Source != "", "--source is required")
	p.Require(c.Sink != "", "--sink is required")
	p.Require(c.LogFormat == "text" || c.LogFormat == "json", "--log-format=%q: want text or json", c.LogFormat)
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		p.Addf("--log-level=%q: want debug, info, warn or error", c.LogLevel)
	}
	if c.PprofAddr != "" {
		host, _, err := net.SplitHostPort(c.PprofAddr)
		ip := net.ParseIP(host)
		p.Require(err == nil && (host == "localhost" || (ip != nil && ip.IsLoopback())), "--pprof-addr=%q must be a loopback address", c.PprofAddr)
	}
	if c.MetricsAddr != "" {
		_, _, err := net.SplitHostPort(c.MetricsAddr)
		p.Require(err == nil, "--metrics-addr=%q: %v", c.MetricsAddr, err)
	}
	p.Require(c.ProgressInterval >= 0, "--progress-interval must not be negative")
	p.Require(c.ReadyLag > 0, "--ready-lag must be positive")
	p.IntRange("--sink-workers", c.SinkWorkers, 1, 256)
	p.Require(c.SinkFlushInterval > 0, "--sink-flush-interval must be positive")
	p.Require(c.SinkMaxFlushInterval >= c.SinkFlushInterval, "--sink-max-flush-interval must be at least --sink-flush-interval")
	p.Require(c.SinkCheckpointInterval > 0, "--sink-checkpoint-interval must be positive")
	p.Require(c.SinkQueueSize >= int64(c.SinkWorkers)*pgsink.MinLaneQueueBytes && c.SinkQueueSize <= pgsink.MaxQueueBytes,
		"--sink-queue-size=%d: at least 64KiB per --sink-workers lane (%d), at most 1TiB", c.SinkQueueSize, c.SinkWorkers)
	p.Require(c.SourceReceiveTimeout == 0 || c.SourceReceiveTimeout >= time.Second, "--source-receive-timeout must be 0 (off) or at least 1s")
	p.Require(c.SourceReadLinger >= 0 && c.SourceReadLinger <= time.Second, "--source-read-linger must be 0..1s")
	p.Require(c.PublicationPollInterval >= 0, "--publication-poll-interval must not be negative")
	c.Settings.Check(p)
	p.Require(c.ShutdownTimeout > 0, "--shutdown-timeout must be positive")
	p.Require(c.MaxRetainedWAL >= 0, "--max-retained-wal must not be negative")
	if err := c.tableRule().Validate(); err != nil {
		p.Addf("--include/--exclude: %v", err)
	}
	return p.Err()
}

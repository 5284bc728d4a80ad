package synthetic

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/cdcflow/eventservice/cmd/cdcserver/app/goruntime"
	"github.com/cdcflow/eventservice/internal/optcheck"
	"github.com/cdcflow/eventservice/pkg/eventservice"
)

// ErrInvalidConfig wraps every configuration error.
var ErrInvalidConfig = errors.New("invalid configuration")

// Config is the demo server's configuration; each field is one flag.
type Config struct {
	Tables      int
	Changefeeds int
	Rate        int
	TxnRows     int
	RowBytes    int
	HotFraction float64
	DDLInterval time.Duration
	// ResolvedInterval is how often each table's resolved-ts advances at
	// the upstream (the generator's tick, 10ms, means every tick).
	ResolvedInterval time.Duration
	// ResolvedGroupTables is how many tables of consecutive IDs share one
	// phase of ResolvedInterval (as the tables of one TiKV region do); 1:
	// each table has its own.
	ResolvedGroupTables int
	Duration            time.Duration
	// DrainTimeout bounds the wait for delivery to catch up after the
	// upstream stopped (end of Duration or Ctrl-C).
	DrainTimeout   time.Duration
	Seed           uint64
	PrepareWorkers int
	ScanWorkers    int
	ScanQueue      int
	ScanLimitBytes int
	InboxCapacity  int
	RefuseRate     float64
	FailRate       float64
	DropRate       float64
	// MoveInterval, if positive, moves a random table every interval: its
	// dispatcher is removed and added again under the same ID from its
	// last checkpoint (a new registration).
	MoveInterval time.Duration
	// DataDir keeps the event store (and, with DurableSink, the sink) on
	// disk; empty means a temporary directory removed at exit.
	DataDir string
	// DurableSink applies rows to a pebble sink in DataDir/sink, persisted
	// with the checkpoints; a restart on the same DataDir resumes from them.
	DurableSink bool
	MetricsAddr string
	// HugePages advises the process's heap for transparent huge pages
	// (cmd/cdcserver/app/hugepages), for hosts whose THP mode is "madvise".
	HugePages bool
	// Settings are the Go runtime's (--gc-percent, --max-procs,
	// --memory-limit) while the server runs; a set environment variable
	// wins. Zero leaves the runtime's.
	goruntime.Settings
	JSON     bool
	LogLevel string
	// ProgressInterval is the period of the progress line (0: none).
	ProgressInterval time.Duration
	// Role is what this process runs: "all" (store, service and
	// collectors, over the in-process transport), "service" (store and
	// service; collectors connect over gRPC at Listen) or "collector"
	// (collectors of the changefeeds in Feeds, connecting to Connect).
	Role string
	// Listen is the service's gRPC address (role service).
	Listen string
	// Connect is the service's address (role collector).
	Connect string
	// RemoteCollectors, if positive, runs the service in this process and
	// starts that many collector processes (this executable with --role
	// collector) on loopback, the changefeeds split among them.
	RemoteCollectors int
	// CollectorConnect, if set, is the address each collector process
	// started by RemoteCollectors dials, comma-separated, one per process
	// (a proxy or a NAT in between); default the listen address.
	CollectorConnect string
	// Feeds lists the changefeeds (1-based) a collector process serves;
	// empty means all of them.
	Feeds string
	// StartTs is the dispatchers' start-ts in a collector process (the
	// service prints it); a restarted collector resumes from its sinks'
	// checkpoints where they are later.
	StartTs uint64
	// CollectorDataDirs are the collector processes' --data-dir, for a
	// service whose collectors were started by hand: after they stop, the
	// service reads their sinks to verify every row.
	CollectorDataDirs string
	// TLSCert, TLSKey and TLSCA enable mutual TLS on the gRPC connection:
	// this process's certificate and key, and the CA that signed its
	// peer's. All three or none.
	TLSCert, TLSKey, TLSCA string
	// Authorize maps collector certificate identities (SANs) to the
	// changefeed targets they may serve: "id=target+target,id=target".
	// Required with TLS on the service (except --remote-collectors, whose
	// processes present the service's own certificate).
	Authorize string
	// InsecureListen lets the service listen without TLS on an address
	// that is not loopback.
	InsecureListen bool
	// FreshBytes bounds the event store's rows held in memory
	// (eventstore.Options.FreshBytes); -1 keeps none, 0 takes the
	// library's default.
	FreshBytes int64
	// MaxTargets and MaxDispatchersPerTarget bound what peers can make
	// the service hold (eventservice.Options).
	MaxTargets, MaxDispatchersPerTarget, MaxDispatchers int
	// Executable is what RemoteCollectors starts (with Command and --role
	// collector): a cdcserver binary; default this process's executable.
	Executable string
	// Flags is the command line as given, echoed in the summary so that a
	// figure names the run that produced it (cmd/cdcserver sets it).
	Flags string
}

// DefaultConfig returns the defaults: `make run` uses them, finishing in
// about 20 seconds on 2 cores with real work (1000 tables).
func DefaultConfig() Config {
	return Config{
		Tables:              1000,
		Changefeeds:         1,
		Rate:                40000,
		TxnRows:             4,
		RowBytes:            100,
		HotFraction:         0.5,
		DDLInterval:         500 * time.Millisecond,
		ResolvedInterval:    10 * time.Millisecond,
		ResolvedGroupTables: 1,
		Duration:            18 * time.Second,
		DrainTimeout:        30 * time.Second,
		Seed:                1,
		PrepareWorkers:      2,
		ScanWorkers:         2,
		ScanQueue:           8,
		ScanLimitBytes:      1 << 20,
		FreshBytes:          DefaultFreshBytes,
		InboxCapacity:       8192,
		MetricsAddr:         "127.0.0.1:0",
		LogLevel:            "warn",
		ProgressInterval:    time.Second,
		Role:                RoleAll,
		Listen:              "127.0.0.1:0",

		MaxTargets:              1024,
		MaxDispatchersPerTarget: eventservice.DefaultMaxDispatchersPerTarget,
		MaxDispatchers:          eventservice.DefaultMaxDispatchers,
	}
}

// DefaultFreshBytes is --fresh-bytes' default: eight times the library's
// (eventstore.DefaultFreshBytes). A server owns its machine's memory, and
// when collectors fall seconds behind (collectors in other processes at
// 400k rows/s) the rows they have not acknowledged fit in memory instead
// of being flushed to pebble and compacted by the service process, on the
// cores the collectors need (docs/benchmarks.md, "Collectors in other
// processes").
const DefaultFreshBytes = 512 << 20

// Command is the cdcserver command that runs this package: cdcserver
// synthetic [flags]. The collector processes --remote-collectors starts
// run Executable with it and --role collector.
const Command = "synthetic"

// Roles.
const (
	RoleAll       = "all"
	RoleService   = "service"
	RoleCollector = "collector"
)

// BindFlags registers every field on fs, with c's values as defaults.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	fs.IntVar(&c.Tables, "tables", c.Tables, "number of upstream tables (one dispatcher per table per changefeed)")
	fs.IntVar(&c.Changefeeds, "changefeeds", c.Changefeeds, "number of changefeeds, each with its own collector and target")
	fs.IntVar(&c.Rate, "rate", c.Rate, "upstream rows per second, all tables together")
	fs.IntVar(&c.TxnRows, "txn-rows", c.TxnRows, "rows per transaction")
	fs.IntVar(&c.RowBytes, "row-bytes", c.RowBytes, "bytes per row value")
	fs.Float64Var(&c.HotFraction, "hot-fraction", c.HotFraction, "fraction of rows that go to the hot 1% of tables (0 = uniform)")
	fs.DurationVar(&c.DDLInterval, "ddl-interval", c.DDLInterval, "interval between schema DDLs (0 = none)")
	fs.DurationVar(&c.ResolvedInterval, "resolved-interval", c.ResolvedInterval, "how often each table's resolved-ts advances at the upstream, as a real upstream's does (10ms, the generator's tick, means every tick)")
	fs.IntVar(&c.ResolvedGroupTables, "resolved-group-tables", c.ResolvedGroupTables, "how many tables of consecutive IDs cross their --resolved-interval boundaries together, as the tables of one TiKV region do (1: each table in a phase of its own)")
	fs.DurationVar(&c.Duration, "duration", c.Duration, "how long the upstream produces rows, from when every dispatcher is registered")
	fs.DurationVar(&c.DrainTimeout, "drain-timeout", c.DrainTimeout, "how long to wait for delivery to catch up after the upstream stops")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "workload seed (same seed, same rows)")
	fs.IntVar(&c.PrepareWorkers, "prepare-workers", c.PrepareWorkers, "preparation workers")
	fs.IntVar(&c.ScanWorkers, "scan-workers", c.ScanWorkers, "scan workers")
	fs.IntVar(&c.ScanQueue, "scan-queue", c.ScanQueue, "scan channel capacity")
	fs.IntVar(&c.ScanLimitBytes, "scan-limit-bytes", c.ScanLimitBytes, "bytes one scan task reads before it yields at a transaction boundary")
	fs.Int64Var(&c.FreshBytes, "fresh-bytes", c.FreshBytes, "bytes of the newest rows the event store keeps in memory, so that a dispatcher behind by seconds is scanned, and its rows dropped at its checkpoint, without pebble writing and compacting them (-1: none; 0: the library's 64 MiB)")
	fs.IntVar(&c.InboxCapacity, "inbox-capacity", c.InboxCapacity, "messages a collector's inbox holds before the transport refuses")
	fs.Float64Var(&c.RefuseRate, "refuse-rate", c.RefuseRate, "fraction of sends the transport refuses as busy (fault injection)")
	fs.Float64Var(&c.FailRate, "fail-rate", c.FailRate, "fraction of sends the transport fails (fault injection)")
	fs.Float64Var(&c.DropRate, "drop-rate", c.DropRate, "fraction of sends silently dropped; collectors detect the gap and reset (fault injection)")
	fs.DurationVar(&c.MoveInterval, "move-interval", c.MoveInterval, "every interval, remove a random table's dispatcher and add it again under the same ID from its last checkpoint, as when a table moves between nodes (0 = off)")
	fs.StringVar(&c.DataDir, "data-dir", c.DataDir, "directory for the event store (default: a temporary directory, removed at exit)")
	fs.BoolVar(&c.DurableSink, "durable-sink", c.DurableSink, "apply rows to a durable pebble sink in --data-dir and resume from its checkpoints on restart")
	c.Settings.BindFlags(fs, "the server")
	fs.BoolVar(&c.HugePages, "huge-pages", c.HugePages, "ask the kernel for transparent huge pages for the heap (Linux; for a host whose THP mode is madvise; roles all and service, not the collector processes): at a million dispatchers TLB misses are much of an advance's cost")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", c.MetricsAddr, "address serving /metrics and /debug/pprof (loopback; port 0 picks one; empty disables)")
	fs.BoolVar(&c.JSON, "json", c.JSON, "print one JSON summary on stdout instead of text")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "log level (debug, info, warn, error); logs go to stderr")
	fs.DurationVar(&c.ProgressInterval, "progress-interval", c.ProgressInterval, "period of the progress line on stderr (0 = none)")
	fs.StringVar(&c.Role, "role", c.Role, "what this process runs: all (one process), service (store and event service; collectors connect over gRPC) or collector")
	fs.StringVar(&c.Listen, "listen", c.Listen, "role service: the gRPC address collectors connect to (port 0 picks one)")
	fs.StringVar(&c.Connect, "connect", c.Connect, "role collector: the service's gRPC address")
	fs.IntVar(&c.RemoteCollectors, "remote-collectors", c.RemoteCollectors, "run the service here and start this many collector processes on loopback, the changefeeds split among them (implies --role service)")
	fs.StringVar(&c.CollectorConnect, "collector-connect", c.CollectorConnect, "with --remote-collectors: the address each collector process dials, comma-separated, one per process (default: the --listen address)")
	fs.StringVar(&c.Feeds, "feeds", c.Feeds, "role collector: comma-separated changefeed numbers (1-based) to serve; empty = all")
	fs.Uint64Var(&c.StartTs, "start-ts", c.StartTs, "role collector: the dispatchers' start-ts, as the service prints it")
	fs.StringVar(&c.CollectorDataDirs, "collector-data-dirs", c.CollectorDataDirs, "role service with collectors started by hand: their --data-dir, comma-separated, read after they stop to verify every row")
	fs.StringVar(&c.TLSCert, "tls-cert", c.TLSCert, "PEM certificate of this process (mutual TLS; with --tls-key and --tls-ca)")
	fs.StringVar(&c.TLSKey, "tls-key", c.TLSKey, "PEM private key of --tls-cert")
	fs.StringVar(&c.TLSCA, "tls-ca", c.TLSCA, "PEM CA certificate that signed the peer's certificate")
	fs.StringVar(&c.Authorize, "authorize", c.Authorize, "role service with TLS: which collector certificate identity (a DNS, URI or e-mail SAN) may serve which changefeed targets, as id=changefeed-1+changefeed-3,id2=changefeed-2 (* = any)")
	fs.BoolVar(&c.InsecureListen, "insecure-listen", c.InsecureListen, "role service: allow --listen on a non-loopback address without TLS (any peer that reaches it may read every changefeed)")
	fs.IntVar(&c.MaxTargets, "max-targets", c.MaxTargets, "most targets (collectors) the service serves at once; a registration for one more is refused")
	fs.IntVar(&c.MaxDispatchersPerTarget, "max-dispatchers-per-target", c.MaxDispatchersPerTarget, "most dispatchers one target may register; more are refused")
	fs.IntVar(&c.MaxDispatchers, "max-dispatchers", c.MaxDispatchers, "most dispatchers the service holds in all (about 1 KiB each); more are refused")
}

// Validate reports every invalid field at once.
func (c Config) Validate() error {
	p := optcheck.New(ErrInvalidConfig)
	p.IntRange("--tables", c.Tables, 1, 10_000_000)
	p.IntRange("--changefeeds", c.Changefeeds, 1, 1000)
	p.IntRange("--rate", c.Rate, 0, 100_000_000)
	p.IntRange("--txn-rows", c.TxnRows, 1, 1_000_000)
	p.IntRange("--row-bytes", c.RowBytes, 0, 64<<20)
	p.IntRange("--prepare-workers", c.PrepareWorkers, 1, 1024)
	p.IntRange("--scan-workers", c.ScanWorkers, 1, 1024)
	p.IntRange("--scan-queue", c.ScanQueue, 1, 1<<20)
	p.IntRange("--scan-limit-bytes", c.ScanLimitBytes, 1, 1<<30)
	p.IntRange("--inbox-capacity", c.InboxCapacity, 64, 1<<24)
	p.Require(c.FreshBytes == -1 || c.FreshBytes == 0 || c.FreshBytes >= 1<<20 && c.FreshBytes <= 1<<40,
		"--fresh-bytes=%d: -1 (none), 0 (the library's default) or 1 MiB to 1 TiB", c.FreshBytes)
	p.IntRange("--max-targets", c.MaxTargets, 1, 1<<20)
	p.IntRange("--max-dispatchers-per-target", c.MaxDispatchersPerTarget, 1, 1<<30)
	p.Require(c.MaxTargets >= c.Changefeeds, "--max-targets=%d is below --changefeeds=%d (a target per changefeed)", c.MaxTargets, c.Changefeeds)
	p.Require(c.MaxDispatchersPerTarget >= c.Tables, "--max-dispatchers-per-target=%d is below --tables=%d (a dispatcher per table)", c.MaxDispatchersPerTarget, c.Tables)
	p.IntRange("--max-dispatchers", c.MaxDispatchers, 1, 1<<30)
	p.Require(c.MaxDispatchers >= c.Tables*c.Changefeeds, "--max-dispatchers=%d is below --tables x --changefeeds = %d", c.MaxDispatchers, c.Tables*c.Changefeeds)
	for _, f := range []struct {
		name string
		v    float64
	}{{"--hot-fraction", c.HotFraction}, {"--refuse-rate", c.RefuseRate}, {"--fail-rate", c.FailRate}, {"--drop-rate", c.DropRate}} {
		p.Require(f.v >= 0 && f.v <= 1, "%s=%v not in [0, 1]", f.name, f.v)
	}
	sum := c.RefuseRate + c.FailRate + c.DropRate
	p.Require(sum < 1, "--refuse-rate + --fail-rate + --drop-rate = %v: at least some sends must succeed", sum)
	p.Require(c.Duration > 0, "--duration=%v must be positive", c.Duration)
	p.Require(c.DrainTimeout > 0, "--drain-timeout=%v must be positive", c.DrainTimeout)
	p.Require(c.DDLInterval >= 0, "--ddl-interval=%v must not be negative", c.DDLInterval)
	p.Require(c.MoveInterval >= 0, "--move-interval=%v must not be negative", c.MoveInterval)
	p.Require(c.ResolvedInterval >= 0, "--resolved-interval=%v must not be negative", c.ResolvedInterval)
	p.Require(c.ResolvedGroupTables >= 1, "--resolved-group-tables=%d must be at least 1", c.ResolvedGroupTables)
	p.Require(c.ProgressInterval >= 0, "--progress-interval=%v must not be negative", c.ProgressInterval)
	p.Require(!c.DurableSink || c.DataDir != "", "--durable-sink needs --data-dir")
	p.Require(!c.DurableSink || c.Changefeeds == 1 || c.Role != RoleAll, "--durable-sink supports one changefeed in one process (it stores rows per table)")
	if c.MetricsAddr != "" {
		host, _, err := net.SplitHostPort(c.MetricsAddr)
		if err != nil {
			p.Addf("--metrics-addr=%q: %v", c.MetricsAddr, err)
		} else if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			p.Addf("--metrics-addr=%q must be a loopback address (it serves pprof)", c.MetricsAddr)
		}
	}
	c.validateRole(p)
	c.Settings.Check(p)
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		p.Addf("--log-level=%q: want debug, info, warn or error", c.LogLevel)
	}
	return p.Err()
}

// validateRole checks the flags of the roles and of the gRPC transport.
func (c Config) validateRole(p *optcheck.Problems) {
	switch c.Role {
	case RoleAll, RoleService, RoleCollector:
	default:
		p.Addf("--role=%q: want all, service or collector", c.Role)
	}
	p.IntRange("--remote-collectors", c.RemoteCollectors, 0, 64)
	p.Require(c.RemoteCollectors == 0 || c.RemoteCollectors <= c.Changefeeds,
		"--remote-collectors=%d: more collector processes than --changefeeds=%d", c.RemoteCollectors, c.Changefeeds)
	p.Require(c.RemoteCollectors == 0 || c.Role != RoleCollector, "--remote-collectors runs the service: not with --role collector")
	if c.CollectorConnect != "" {
		n := len(strings.Split(c.CollectorConnect, ","))
		p.Require(n == c.RemoteCollectors, "--collector-connect lists %d addresses for --remote-collectors=%d", n, c.RemoteCollectors)
	}
	tls := 0
	for _, f := range []string{c.TLSCert, c.TLSKey, c.TLSCA} {
		if f != "" {
			tls++
		}
	}
	p.Require(tls == 0 || tls == 3, "--tls-cert, --tls-key and --tls-ca go together (mutual TLS)")
	if c.Role == RoleCollector {
		p.Require(c.Connect != "", "--role collector needs --connect")
		p.Require(c.DataDir != "", "--role collector needs --data-dir (its durable sinks)")
		p.Require(c.StartTs != 0, "--role collector needs --start-ts (the service prints it)")
		if _, err := parseFeeds(c.Feeds, c.Changefeeds); err != nil {
			p.Addf("--feeds=%q: %v", c.Feeds, err)
		}
	}
	if c.Role == RoleService || c.RemoteCollectors > 0 {
		if host, _, err := net.SplitHostPort(c.Listen); err != nil {
			p.Addf("--listen=%q: %v", c.Listen, err)
		} else if ip := net.ParseIP(host); tls == 0 && !c.InsecureListen && host != "localhost" && (ip == nil || !ip.IsLoopback()) {
			p.Addf("--listen=%q without TLS is not loopback: any peer that reaches it could read every changefeed; use --tls-cert/--tls-key/--tls-ca, or --insecure-listen", c.Listen)
		}
		p.Require(c.Authorize == "" || tls == 3, "--authorize needs TLS (--tls-cert, --tls-key, --tls-ca): without it a collector has no identity")
		p.Require(tls == 0 || c.Authorize != "" || c.RemoteCollectors > 0,
			"--tls-cert on the service needs --authorize (which collector certificate identity serves which changefeed)")
		p.Require(c.MoveInterval == 0, "--move-interval needs the collectors in this process (--role all)")
		p.Require(!c.DurableSink, "--durable-sink is --role all's; remote collectors always apply to durable sinks")
	}
}

// parseFeeds parses a --feeds list: changefeed numbers in [1, n], or all
// of them if s is empty.
func parseFeeds(s string, n int) ([]int, error) {
	if s == "" {
		out := make([]int, n)
		for i := range out {
			out[i] = i + 1
		}
		return out, nil
	}
	var out []int
	seen := map[int]bool{}
	for _, part := range strings.Split(s, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(part))
		if err != nil || v < 1 || v > n {
			return nil, fmt.Errorf("%q is not a changefeed number in [1, %d]", part, n)
		}
		if seen[v] {
			return nil, fmt.Errorf("changefeed %d listed twice", v)
		}
		seen[v] = true
		out = append(out, v)
	}
	return out, nil
}

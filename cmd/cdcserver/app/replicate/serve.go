package replicate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/pingcap/log"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventcollector"
	"github.com/cdcflow/eventservice/pkg/eventservice"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/pgcodec"
	"github.com/cdcflow/eventservice/pkg/pgsink"
	"github.com/cdcflow/eventservice/pkg/pgsource"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

// ErrSetup wraps what stops serve before it runs: a bad DSN, a source
// that cannot be replicated (wal_level, a table without a key), a target
// that refuses the checkpoint table. cdcserver exits 2 for it.
var ErrSetup = errors.New("setup failed")

// target is the one target of serve's in-process transport.
const target messaging.Target = "changefeed-1"

// dispatcherOf is the dispatcher of a table.
func dispatcherOf(oid uint32) common.DispatcherID { return common.DispatcherID{Hi: 1, Lo: uint64(oid)} }

// parts is what serve runs, closed in reverse order of building.
type parts struct {
	reg       *prometheus.Registry
	log       *zap.Logger
	sink      *pgsink.Sink
	positions *pgsource.TablePositions
	source    *pgsource.Source
	store     *eventstore.Store
	schema    *schemastore.Memory
	inproc    *messaging.InProcess
	svc       *eventservice.Service
	coll      *eventcollector.Collector
	dataDir   string
	tmpDir    bool
	dirLock   *dataDirLock
	// closedAll: close ended every part (its budget did not cut it off).
	closedAll atomic.Bool
	pre       *preflight
	health    health
	met       *serveMetrics
	// stoppedWritten is the list of stopped tables last written to the
	// target (nil: none yet; recordStopped's).
	stoppedWritten *string
	info           pgsource.Info
	newTables      chan newTable
	// known are the tables bound (addNewTables' after build); ckpts the
	// checkpoints the target held at the start (read-only after build).
	known  map[uint32]bool
	ckpts  map[common.DispatcherID]common.Ts
	copier *copier
	// members records the tables' membership rows (members.go).
	members *members
	wg      sync.WaitGroup
	// cancel ends the goroutines of parts (new tables) at close.
	cancel context.CancelFunc
	// stopBy is when a clean stop must be over (zero until one began):
	// its quiesce, the snapshot's record and close share ShutdownTimeout.
	stopBy time.Time
	knobs  *stopKnobs
}

type newTable struct {
	rel     pgcodec.Relation
	firstTs common.Ts
	rejoin  bool // it left the publication and joined it again (OnRejoin)
}

// Embedding is what a process that runs many changefeeds (a cluster
// node) gives a changefeed's run, in place of what serve does for itself:
// the Go runtime's settings and the Go and process collectors are the
// process's, not applied or registered by the run, and its HTTP endpoints
// are the process's (the Config's MetricsAddr and PprofAddr must be
// empty).
type Embedding struct {
	// Registry receives the changefeed's metrics. Required. It may be
	// gathered once Serving was called, not before: serve's own
	// /metrics serves only from that point (its gauges read the parts
	// the start builds).
	Registry *prometheus.Registry
	// Serving, if set, is called once the start built every part, where
	// serve starts serving its HTTP.
	Serving func()
	// Permit is pgsink.Options.Permit: asked before every transaction
	// the changefeed sends to the target.
	Permit func() error
	// FenceWait bounds the start's wait for an earlier owner's open
	// transactions, after which the backends holding them are ended
	// (pgsink.Options.EndFenceHolders): a node frozen inside a target
	// transaction holds a take-over this long at most. 0: pgsink's
	// default wait, and a start that fails after it.
	FenceWait time.Duration
	// StoreCache is the block cache of the process's event stores
	// (eventstore.Options.Cache): the run's store takes a reference to it
	// and releases it when the run ends; the process keeps its own. nil:
	// a cache of the store's own, serve's default.
	StoreCache *pebble.Cache
	// StoreMemTableBytes is the run's event store's memtable size
	// (eventstore.Options.MemTableBytes). 0: serve's default.
	StoreMemTableBytes uint64
	// SinkQueueBytes is the run's --sink-queue-size (the bytes of rows
	// its sink holds in memory, pgsink.Options.QueueBytes). 0: the
	// config's.
	SinkQueueBytes int64
}

// RunEmbedded is Run for a changefeed of a process that runs many.
func RunEmbedded(ctx context.Context, cfg Config, stderr io.Writer, emb Embedding) error {
	if emb.Registry == nil || cfg.MetricsAddr != "" || cfg.PprofAddr != "" {
		return fmt.Errorf("%w: an embedded run takes a registry and serves no HTTP of its own", ErrInvalidConfig)
	}
	cfg.embedding = &emb
	if emb.SinkQueueBytes != 0 {
		cfg.SinkQueueSize = emb.SinkQueueBytes
	}
	return Run(ctx, cfg, stderr)
}

// Run is `cdcserver serve`: it replicates cfg.Source into cfg.Sink until
// ctx ends (SIGTERM), then stops cleanly within ShutdownTimeout. A restart
// resumes from the sink's checkpoints.
func Run(ctx context.Context, cfg Config, stderr io.Writer) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	lg, err := newLogger(cfg, stderr)
	if err != nil {
		return fmt.Errorf("%w: logger: %w", ErrInvalidConfig, err)
	}
	if cfg.embedding == nil {
		defer cfg.Settings.Apply(os.Getenv)()
	}
	// Everything a start can fail on, before anything is changed on
	// either database: the ports, then both databases (preflight.go).
	httpSrv, err := listenHTTP(cfg)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSetup, err)
	}
	p := &parts{reg: prometheus.NewRegistry(), log: lg, newTables: make(chan newTable, 64), knobs: cfg.stopKnobs}
	if cfg.embedding != nil {
		p.reg = cfg.embedding.Registry
	}
	defer func() { httpSrv.close(p.stopBy) }()
	defer func() { p.closeDataDir() }()
	if err := p.openDataDir(cfg); err != nil {
		return fmt.Errorf("%w: %w", ErrSetup, err)
	}
	if p.pre, err = checkStart(ctx, cfg); err != nil {
		return fmt.Errorf("%w: %w", ErrSetup, err)
	}
	if cfg.embedding == nil {
		p.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	if p.met, err = newServeMetrics(p, cfg); err != nil {
		return fmt.Errorf("%w: %w", ErrSetup, err)
	}
	p.setPhase(phaseStarting)
	ctx, p.cancel = context.WithCancel(ctx)
	defer func() { p.close(p.closeBudget(cfg.ShutdownTimeout)) }()
	if err := p.build(ctx, cfg); err != nil {
		return err
	}
	httpSrv.serve(cfg, p)
	if cfg.embedding != nil && cfg.embedding.Serving != nil {
		cfg.embedding.Serving()
	}
	lg.Info("serving", zap.Int("tables", len(p.info.Tables)), zap.Bool("snapshot", p.info.Created),
		zap.Stringer("resume_ts", p.info.ResumeTs), zap.String("metrics", httpSrv.metricsAddr()), zap.String("pprof", httpSrv.pprofAddr()))
	fmt.Fprintf(stderr, "serve: replicating %d tables; metrics at %s\n", len(p.info.Tables), orNone(httpSrv.metricsAddr()))
	return p.loop(ctx, cfg, stderr)
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// newLogger is a pingcap/log logger on stderr, text or JSON.
func newLogger(cfg Config, stderr io.Writer) (*zap.Logger, error) {
	// No stack traces but at debug: an operator's log says what failed and
	// why, once; a stack of every ERROR line buried that.
	lg, _, err := log.InitLoggerWithWriteSyncer(&log.Config{Level: cfg.LogLevel, Format: cfg.LogFormat, DisableStacktrace: cfg.LogLevel != "debug"},
		zapcore.AddSync(stderr), zapcore.AddSync(stderr))
	return lg, err
}

// loop runs until ctx ends or the source stops for good: it records the
// snapshot's completion and prints the progress line.
func (p *parts) loop(ctx context.Context, cfg Config, stderr io.Writer) error {
	every := cfg.loopInterval
	if every == 0 {
		every = time.Second
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	prog := newProgress(p, stderr)
	nextProgress := time.Now().Add(cfg.ProgressInterval)
	snapshotRecorded := !p.info.Created
	p.health.snapshotApplied.Store(snapshotRecorded)
	p.setPhase(phaseOf(false, p.source.Snapshot().Running, snapshotRecorded))
	for {
		select {
		case <-ctx.Done():
			p.log.Info("stopping")
			p.setPhase(phaseStopping)
			p.stopBy = time.Now().Add(cfg.ShutdownTimeout)
			if p.quiesce(cfg.ShutdownTimeout / 2) {
				// A snapshot or a copy applied in full since the last tick:
				// recorded now, or the next start would take it for
				// interrupted and copy its tables again.
				p.recordAtStop(cfg, !snapshotRecorded)
			}
			return nil
		case <-tick.C:
		}
		// The fence first: a source that stopped because a later serve
		// took the slot over (pgsource.ErrSlotTakenOver) is explained by it.
		if err := p.sink.CheckFence(ctx); errors.Is(err, pgsink.ErrSuperseded) {
			return err // a later serve of this changefeed took over
		}
		if err := p.source.Err(); err != nil {
			return err
		}
		if !snapshotRecorded {
			snapshotRecorded, _ = p.recordSnapshot(ctx, cfg) // the target down: the next tick tries again
			p.health.snapshotApplied.Store(snapshotRecorded)
		}
		p.setPhase(phaseOf(false, p.source.Snapshot().Running, snapshotRecorded))
		p.boundWAL(ctx, cfg)
		p.recordStopped(ctx, cfg)
		if cfg.ProgressInterval > 0 && !time.Now().Before(nextProgress) {
			prog.print()
			nextProgress = time.Now().Add(cfg.ProgressInterval)
		}
	}
}

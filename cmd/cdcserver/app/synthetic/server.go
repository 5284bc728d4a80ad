// The server: it builds every part, starts them, runs the monitor, stops
// the parts in dependency order, then verifies and prints the summary
// (Run).

package synthetic

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pingcap/log"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/cdcflow/eventservice/cmd/cdcserver/app/hugepages"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventcollector"
	"github.com/cdcflow/eventservice/pkg/eventservice"
	"github.com/cdcflow/eventservice/pkg/eventstore"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/pebblesink"
	"github.com/cdcflow/eventservice/pkg/schemastore"
	"github.com/cdcflow/eventservice/pkg/upstream"
)

// feed is one changefeed: a target, its collector and its dispatchers.
type feed struct {
	target messaging.Target
	coll   *eventcollector.Collector
	mem    *eventcollector.MemorySink // nil with a durable sink
	// durable is the feed's durable sink: --durable-sink's, or, with the
	// collector in another process, its sink opened for verification.
	durable *pebblesink.Sink
	// remote: the feed's collector runs in another process (coll is nil).
	remote bool
	ds     []dispatcherRef
}

type dispatcherRef struct {
	id      common.DispatcherID
	table   int64
	startTs common.Ts
}

// server holds the running parts.
type server struct {
	// lookup is the monitor's checkpoint reader (its goroutine's alone).
	lookup  checkpointLookup
	cfg     Config
	log     *zap.Logger
	reg     *prometheus.Registry
	meta    runMeta
	sched   ddlSchedule
	dataDir string
	tmpDir  string

	gen   *upstream.Generator
	began time.Time
	// liveFrom is when the upstream started, after registration: a
	// dispatcher is warm once its checkpoint passed it (see monitor).
	liveFrom common.Ts
	liveAt   time.Time // liveFrom's wall time
	// warm tells when the warm-up ends; nil with collectors in other
	// processes (the monitor sweeps their checkpoints instead).
	warm    *warmTracker
	store   *eventstore.Store
	schema  *schemastore.Memory
	inproc  *messaging.InProcess // nil with remote collectors
	rs      *remoteSide          // nil with collectors in this process
	faulty  *messaging.Faulty
	svc     *eventservice.Service
	durable *pebblesink.Sink
	feeds   []*feed
	mover   *mover // nil unless --move-interval

	metrics *metricsServer
	wg      sync.WaitGroup
	// diag describes, before shutdown, the dispatchers that did not reach
	// their final resolved-ts.
	diag map[common.DispatcherID]string
	// hooks are the test seams (runHooks); zero in production.
	hooks runHooks
}

// runHooks are the server's test seams; all nil in production.
type runHooks struct {
	// wrapSink wraps the sink of changefeed feed (1-based) when its
	// collector runs in this process.
	wrapSink func(feed int, sink eventcollector.Sink) eventcollector.Sink
	// beforeStop runs once the run is over (delivered, drain deadline, or
	// a failed start), before any part stops: a collector's Close waits
	// for the sink call in flight, so a test that holds one releases it
	// here.
	beforeStop func()
	// finished runs at the same point with the run's metrics registry,
	// for a test that reads what the parts counted over the whole run.
	finished func(reg prometheus.Gatherer)
}

// Run runs the server until the workload is delivered (or ctx is cancelled,
// e.g. by SIGINT), verifies, writes the summary to stdout and returns it.
// A configuration error is returned before anything starts.
func Run(ctx context.Context, cfg Config, stdout, stderr io.Writer) (Summary, error) {
	return run(ctx, cfg, stdout, stderr, runHooks{})
}

// run is Run with test seams.
func run(ctx context.Context, cfg Config, stdout, stderr io.Writer, hooks runHooks) (Summary, error) {
	if err := cfg.Validate(); err != nil {
		return Summary{}, err
	}
	s, err := buildWith(cfg, stderr, hooks)
	if err != nil {
		return Summary{}, err
	}
	defer s.cleanup()
	// Before the dispatchers are registered, so that the registration's
	// heap already grows under the limit.
	defer cfg.Settings.Apply(os.Getenv)()
	if cfg.HugePages {
		// Before the dispatchers are registered, so that their memory is
		// backed by huge pages as it is first touched.
		hp, err := hugepages.New(hugepages.Options{})
		if err != nil {
			return Summary{}, err
		}
		if err := hp.Start(); err != nil {
			return Summary{}, fmt.Errorf("--huge-pages: %w", err)
		}
		defer hp.Close()
	}
	if err := s.start(stderr); err != nil {
		s.stop(stderr)
		return Summary{}, err
	}
	if addr := s.metricsAddr(); addr != "" {
		fmt.Fprintf(stderr, "serving http://%s/metrics and /debug/pprof\n", addr)
	}
	run := s.monitor(ctx, stderr)
	finals := s.finalTargets(run)
	s.diagnose(run, finals)
	s.stop(stderr)
	if s.rs != nil {
		// The collector processes have stopped: their sinks can be read.
		s.openRemoteSinks()
		defer s.closeRemoteSinks()
	}
	sum := s.verify(run, finals)
	sum.Role = s.cfg.Role
	if s.rs != nil {
		sum.Role = RoleService
		sum.RowsApplied, sum.Resets = 0, 0
		s.remoteTotals(&sum)
	}
	sum.WallSec, sum.PeakRSSMB, sum.Flags = time.Since(s.began).Seconds(), peakRSSMB(), cfg.Flags
	sum.THP = thpMode(thpModeFile)
	if err := writeSummary(stdout, cfg.JSON, sum); err != nil {
		return sum, err
	}
	return sum, nil
}

// build creates every part; nothing runs yet.
func build(cfg Config, stderr io.Writer) (*server, error) { return buildWith(cfg, stderr, runHooks{}) }

func buildWith(cfg Config, stderr io.Writer, hooks runHooks) (*server, error) {
	lg, _, err := log.InitLoggerWithWriteSyncer(&log.Config{Level: cfg.LogLevel, Format: "text"}, zapcore.AddSync(stderr), zapcore.AddSync(stderr))
	if err != nil {
		return nil, fmt.Errorf("logger: %w", err)
	}
	s := &server{cfg: cfg, log: lg.Named("cdcserver"), reg: prometheus.NewRegistry(), began: time.Now(), hooks: hooks}
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s.dataDir = cfg.DataDir
	if s.dataDir == "" {
		if s.tmpDir, err = os.MkdirTemp("", "cdcserver-"); err != nil {
			return nil, err
		}
		s.dataDir = s.tmpDir
	}
	var resumed bool
	if s.meta, resumed, err = loadOrCreateMeta(cfg, common.TsFromTime(time.Now())); err != nil {
		s.cleanup()
		return nil, err
	}
	if err := s.buildParts(resumed); err != nil {
		s.cleanup()
		return nil, err
	}
	return s, nil
}

func (s *server) buildParts(resumed bool) error {
	cfg := s.cfg
	var err error
	s.gen, err = upstream.NewGenerator(upstream.GeneratorOptions{Tables: cfg.Tables, RowsPerSec: cfg.Rate, TxnRows: cfg.TxnRows,
		RowBytes: cfg.RowBytes, HotFraction: cfg.HotFraction, Seed: s.meta.Seed, StartTs: s.meta.StartTs, EndTs: s.meta.EndTs,
		ResolvedInterval: cfg.ResolvedInterval, ResolvedGroupTables: cfg.ResolvedGroupTables,
		// The schema store moves with the feed, before any table's
		// resolved-ts passes it (s.schema and s.sched are set before
		// the generator starts).
		OnFrontier: func(f common.Ts) { advanceSchema(s.schema, s.sched, f) },
		Logger:     s.log.Named("upstream")})
	if err != nil {
		return err
	}
	// Every table of every changefeed is a dispatcher of this store and
	// service: their indexes are sized for them at once.
	dispatchers := min(cfg.Tables*cfg.Changefeeds, eventstore.MaxExpectedDispatchers, eventservice.MaxExpectedDispatchers)
	s.store, err = eventstore.Open(eventstore.Options{Dir: filepath.Join(s.dataDir, "eventstore"), Upstream: s.gen,
		ExpectedDispatchers: dispatchers, FreshBytes: cfg.FreshBytes, Registerer: s.reg, Logger: s.log})
	if err != nil {
		return err
	}
	s.schema, err = schemastore.NewMemory(schemastore.MemoryOptions{InitialResolvedTs: s.meta.StartTs, Logger: s.log})
	if err != nil {
		return err
	}
	var tr messaging.Transport
	if cfg.Role == RoleService || cfg.RemoteCollectors > 0 {
		if s.rs, err = s.newRemoteSide(); err != nil {
			return err
		}
		tr = s.rs.srv
	} else {
		s.inproc, err = messaging.NewInProcess(messaging.InProcessOptions{Capacity: cfg.InboxCapacity, Logger: s.log})
		if err != nil {
			return err
		}
		tr = s.inproc
	}
	if cfg.RefuseRate > 0 || cfg.FailRate > 0 || cfg.DropRate > 0 {
		// Faults go between the service and whichever transport it sends
		// through: the in-process one, or the gRPC server of collectors in
		// other processes.
		s.faulty, err = messaging.NewFaulty(tr, messaging.FaultOptions{Seed: s.meta.Seed, RefuseRate: cfg.RefuseRate,
			FailRate: cfg.FailRate, DropRate: cfg.DropRate})
		if err != nil {
			return err
		}
		tr = s.faulty
	}
	s.svc, err = eventservice.New(eventservice.Options{Store: s.store, Schema: s.schema, Transport: tr,
		PrepareWorkers: cfg.PrepareWorkers, ScanWorkers: cfg.ScanWorkers, ScanQueueSize: cfg.ScanQueue,
		ScanLimitBytes: cfg.ScanLimitBytes, LargeTxnSplitBytes: max(eventservice.DefaultLargeTxnSplitBytes, cfg.ScanLimitBytes),
		// Both batch sizes stay well below the inbox: a batch near its
		// capacity would be accepted only when the inbox is nearly empty.
		MaxMessagesPerTask:      min(eventservice.DefaultMaxMessagesPerTask, cfg.InboxCapacity/4),
		ResolvedBatch:           min(eventservice.DefaultResolvedBatch, cfg.InboxCapacity/4),
		MaxTargets:              cfg.MaxTargets,
		MaxDispatchersPerTarget: cfg.MaxDispatchersPerTarget,
		MaxDispatchers:          cfg.MaxDispatchers,
		ExpectedDispatchers:     dispatchers, // at most MaxDispatchers: the config checks it
		Registerer:              s.reg, Logger: s.log})
	if err != nil {
		return err
	}
	if cfg.DurableSink {
		if s.durable, err = pebblesink.Open(filepath.Join(s.dataDir, "sink")); err != nil {
			return err
		}
	}
	if s.rs == nil {
		// Every collector is in this process: their sinks tell when the
		// warm-up ends (warmup.go).
		s.warm = newWarmTracker(cfg.Changefeeds, cfg.Tables, time.Now)
	}
	for c := range cfg.Changefeeds {
		if err := s.buildFeed(c, resumed); err != nil {
			return err
		}
	}
	return nil
}

func (s *server) buildFeed(c int, resumed bool) error {
	f := &feed{target: targetOf(c + 1)}
	if s.rs != nil {
		// The collector is in another process: the service only needs the
		// dispatchers, to verify them.
		f.remote = true
		for t := 1; t <= s.cfg.Tables; t++ {
			f.ds = append(f.ds, dispatcherRef{id: common.DispatcherID{Hi: uint64(c + 1), Lo: uint64(t)}, table: int64(t), startTs: s.meta.StartTs})
		}
		s.feeds = append(s.feeds, f)
		return nil
	}
	inbox, err := s.inproc.Register(f.target)
	if err != nil {
		return err
	}
	var sink eventcollector.Sink
	if s.durable != nil {
		sink = s.durable
		f.durable = s.durable
	} else {
		f.mem = eventcollector.NewMemorySink()
		sink = f.mem
	}
	if s.hooks.wrapSink != nil {
		sink = s.hooks.wrapSink(c+1, sink)
	}
	sink = wrapWarm(sink, s.warm) // outermost: it notes what the collector is told
	f.coll, err = eventcollector.New(eventcollector.Options{Service: s.svc, Inbox: inbox, Sink: sink, Registerer: s.reg, Logger: s.log,
		ExpectedDispatchers: s.cfg.Tables})
	if err != nil {
		return err
	}
	for t := 1; t <= s.cfg.Tables; t++ {
		ref := dispatcherRef{id: common.DispatcherID{Hi: uint64(c + 1), Lo: uint64(t)}, table: int64(t), startTs: s.meta.StartTs}
		if s.durable != nil {
			s.durable.Bind(ref.id, ref.table)
			if resumed {
				ckpt, err := s.durable.CheckpointOf(ref.id)
				if err != nil {
					return err
				}
				ref.startTs = max(ref.startTs, ckpt)
			}
		}
		f.ds = append(f.ds, ref)
	}
	s.feeds = append(s.feeds, f)
	return nil
}

// start starts every part, registers the dispatchers (or, with remote
// collectors, waits until they have), then the upstream.
func (s *server) start(stderr io.Writer) error {
	if err := s.store.Start(); err != nil {
		return err
	}
	if err := s.svc.Start(); err != nil {
		return err
	}
	if s.rs != nil {
		if err := s.startRemote(stderr); err != nil {
			return err
		}
		if err := s.awaitRegistrations(); err != nil {
			return err
		}
	}
	for _, f := range s.feeds {
		if f.remote {
			continue
		}
		if err := f.coll.Start(); err != nil {
			return err
		}
		specs := make([]eventcollector.DispatcherSpec, len(f.ds))
		for i, d := range f.ds {
			specs[i] = eventcollector.DispatcherSpec{ID: d.id, Span: common.TableSpan(d.table), StartTs: d.startTs}
		}
		for i, err := range f.coll.AddDispatchers(context.Background(), specs) {
			if err != nil {
				return fmt.Errorf("add dispatcher of table %d: %w", f.ds[i].table, err)
			}
		}
	}
	if s.meta.EndTs == 0 { // fresh: the run's clock starts now
		if err := s.meta.endAfter(s.cfg, time.Now()); err != nil {
			return err
		}
		if err := s.gen.SetEndTs(s.meta.EndTs); err != nil {
			return err
		}
	}
	s.liveAt = time.Now()
	s.liveFrom = common.TsFromTime(s.liveAt)
	if s.warm != nil {
		s.warm.arm(s.liveFrom)
	}
	s.sched = ddlSchedule{seed: s.meta.Seed, tables: s.cfg.Tables, interval: s.cfg.DDLInterval, start: s.meta.StartTs, end: s.meta.EndTs}
	if err := s.gen.Start(); err != nil {
		return err
	}
	if s.cfg.MoveInterval > 0 {
		s.mover = newMover(s)
		go s.mover.run(s.cfg.MoveInterval)
	}
	return s.serveMetrics()
}

// serveMetrics serves /metrics and /debug/pprof on the loopback address.
func (s *server) serveMetrics() error {
	m, err := serveMetricsOf(s.cfg.MetricsAddr, s.reg, s.log)
	if err != nil {
		return err
	}
	s.metrics = m
	return nil
}

// metricsAddr returns the address /metrics is served on, once started.
func (s *server) metricsAddr() string { return s.metrics.addr() }

// stop stops every part in dependency order: the mover, upstream and schema
// first, then collectors (in this process, or the collector processes),
// the service (which unregisters from the store), the store, the
// transport and the metrics server.
func (s *server) stop(stderr io.Writer) {
	if s.hooks.beforeStop != nil {
		s.hooks.beforeStop() // before the collectors' Close waits for a sink call it holds
	}
	if s.hooks.finished != nil {
		s.hooks.finished(s.reg)
	}
	if s.mover != nil {
		s.mover.close() // before the collectors close: a move calls them
	}
	s.gen.Close()
	if s.rs != nil {
		s.stopCollectors(stderr)
	}
	for _, f := range s.feeds {
		if f.coll == nil {
			continue
		}
		if err := f.coll.Close(); err != nil {
			s.log.Warn("close collector", zap.Error(err))
		}
	}
	if err := s.svc.Close(); err != nil {
		s.log.Warn("close service", zap.Error(err))
	}
	if err := s.store.Close(); err != nil {
		s.log.Warn("close store", zap.Error(err))
	}
	if s.inproc != nil {
		s.inproc.Close()
	}
	if s.rs != nil {
		s.rs.srv.Close()
	}
	s.metrics.close()
	s.wg.Wait()
}

// cleanup releases what build acquired (closing twice is harmless).
func (s *server) cleanup() {
	if s.svc != nil {
		_ = s.svc.Close()
	}
	if s.store != nil {
		_ = s.store.Close()
	}
	if s.durable != nil {
		_ = s.durable.Close()
		s.durable = nil
	}
	if s.tmpDir != "" {
		_ = os.RemoveAll(s.tmpDir)
		s.tmpDir = ""
	}
}

// thpModeFile is where Linux says its transparent-huge-page mode.
const thpModeFile = "/sys/kernel/mm/transparent_hugepage/enabled"

// thpMode returns the mode the file at path selects (the bracketed word
// of "always [madvise] never"), or "" when it cannot be read or parsed.
func thpMode(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	for _, w := range strings.Fields(string(b)) {
		if len(w) > 2 && w[0] == '[' && w[len(w)-1] == ']' {
			return w[1 : len(w)-1]
		}
	}
	return ""
}

// peakRSSMB is the process's peak resident set size in MB (Linux reports
// ru_maxrss in KiB); 0 where getrusage fails.
func peakRSSMB() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return float64(ru.Maxrss) / 1024
}

package replicate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

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
	info      pgsource.Info
	newTables chan newTable
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
	defer cfg.Settings.Apply(os.Getenv)()
	p := &parts{reg: prometheus.NewRegistry(), log: lg, newTables: make(chan newTable, 64), knobs: cfg.stopKnobs}
	p.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ctx, p.cancel = context.WithCancel(ctx)
	defer func() { p.close(p.closeBudget(cfg.ShutdownTimeout)) }()
	if err := p.build(ctx, cfg); err != nil {
		return err
	}
	httpSrv, err := serveHTTP(cfg, p)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSetup, err)
	}
	defer func() { httpSrv.close(p.stopBy) }()
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
	lg, _, err := log.InitLoggerWithWriteSyncer(&log.Config{Level: cfg.LogLevel, Format: cfg.LogFormat},
		zapcore.AddSync(stderr), zapcore.AddSync(stderr))
	return lg, err
}

// build opens the sink, the source (starting over if its snapshot never
// completed), the store, the service and the collector, and registers a
// dispatcher per table from its checkpoint.
func (p *parts) build(ctx context.Context, cfg Config) error {
	var err error
	setup := func(err error) error { return fmt.Errorf("%w: %w", ErrSetup, err) }
	// What each step took, logged once built: a restart's backlog waits
	// for all of it before the stream starts.
	began, last := time.Now(), time.Now()
	var took []zap.Field
	step := func(name string) {
		now := time.Now()
		took = append(took, zap.Duration(name, now.Sub(last)))
		last = now
	}
	if p.sink, err = pgsink.New(pgsink.Options{DSN: cfg.Sink, Workers: cfg.SinkWorkers, FlushInterval: cfg.SinkFlushInterval, MaxFlushInterval: cfg.SinkMaxFlushInterval,
		CheckpointInterval: cfg.SinkCheckpointInterval, Owner: cfg.Slot, SoleOwner: true, Logger: p.log, Registerer: p.reg}); err != nil {
		return setup(err)
	}
	if err := p.sink.Start(ctx); err != nil {
		return setup(err)
	}
	if p.positions, err = pgsource.NewTablePositions(ctx, cfg.Sink); err != nil {
		return setup(err)
	}
	if p.schema, err = schemastore.NewMemory(schemastore.MemoryOptions{InitialResolvedTs: 1, Logger: p.log}); err != nil {
		return setup(err)
	}
	step("sink")
	if err := p.startOrResume(ctx, cfg); err != nil {
		return err
	}
	if !p.info.Created {
		// The walsender decodes again what the slot retains before its
		// confirmed position (up to about 30 s of the stream before the
		// stop) while the store, the sink's binding and the dispatchers
		// come up; Start reads the stream.
		if err := p.source.OpenStream(ctx); err != nil {
			p.log.Warn("the stream could not start early: it starts with the source", zap.Error(err))
		}
	}
	step("source")
	p.dataDir = cfg.DataDir
	if p.dataDir == "" {
		if p.dataDir, err = os.MkdirTemp("", "cdcserver-serve-"); err != nil {
			return setup(err)
		}
		p.tmpDir = true
	}
	storeDir := filepath.Join(p.dataDir, "eventstore")
	_ = os.RemoveAll(storeDir) // a cache: the slot is the durable log
	if p.store, err = eventstore.Open(eventstore.Options{Dir: storeDir, Upstream: p.source, Registerer: p.reg, Logger: p.log}); err != nil {
		return setup(err)
	}
	if err := p.store.Start(); err != nil {
		return setup(err)
	}
	if p.inproc, err = messaging.NewInProcess(messaging.InProcessOptions{Capacity: 8192, Logger: p.log}); err != nil {
		return setup(err)
	}
	inbox, err := p.inproc.Register(target)
	if err != nil {
		return setup(err)
	}
	if p.svc, err = eventservice.New(eventservice.Options{Store: p.store, Schema: p.schema, Transport: p.inproc,
		MaxMessagesPerTask: 2048, ResolvedBatch: 2048, Registerer: p.reg, Logger: p.log}); err != nil {
		return setup(err)
	}
	if err := p.svc.Start(); err != nil {
		return setup(err)
	}
	if p.coll, err = eventcollector.New(eventcollector.Options{Service: p.svc, Inbox: inbox, Sink: p.sink, Registerer: p.reg, Logger: p.log}); err != nil {
		return setup(err)
	}
	if err := p.coll.Start(); err != nil {
		return setup(err)
	}
	step("store")
	ckpts, err := p.sink.Checkpoints(ctx)
	if err != nil {
		return setup(err)
	}
	binds := make([]pgsink.Binding, len(p.info.Tables))
	for i, rel := range p.info.Tables {
		start := p.info.ResumeTs
		if p.info.Created {
			start = p.info.SnapshotTs - 1
		} else if c, ok := ckpts[dispatcherOf(rel.OID)]; ok && c > start {
			start = c
		}
		binds[i] = pgsink.Binding{ID: dispatcherOf(rel.OID), Rel: rel, StartTs: start}
	}
	published := make(map[uint32]bool, len(p.info.Tables))
	for _, rel := range p.info.Tables {
		published[rel.OID] = true
	}
	// A table not published at the start has left the changefeed (one
	// created since is bound, and the sink looks at those first).
	p.sink.SetLeft(func(oid uint32) bool { return !published[oid] })
	p.ckpts = ckpts
	if err := p.queueCopies(ctx, cfg, ckpts); err != nil { // listed before a checkpoint can be written
		return setup(err)
	}
	if err := p.sink.BindAll(ctx, binds); err != nil {
		return setup(err)
	}
	step("bind")
	specs := make([]eventcollector.DispatcherSpec, len(binds))
	for i, b := range binds {
		specs[i] = eventcollector.DispatcherSpec{ID: b.ID, Span: common.TableSpan(int64(b.Rel.OID)), StartTs: b.StartTs}
	}
	for i, err := range p.coll.AddDispatchers(ctx, specs) {
		if err != nil {
			return setup(fmt.Errorf("register %s: %w", binds[i].Rel.QualifiedName(), err))
		}
	}
	step("register")
	if err := p.source.Start(); err != nil {
		return setup(err)
	}
	p.log.Info("built", append(took, zap.Duration("total", time.Since(began)))...)
	p.wg.Go(func() { p.addNewTables(ctx) })
	p.wg.Go(func() { p.copier.run(ctx) })
	return nil
}

// queueCopies queues the copies a start owes: on a resumed slot, the
// published tables the target lists as not yet copied, those without a
// checkpoint (they joined while no serve ran) and, anew, those that left
// the publication and joined it again while no serve ran (members.go). A
// new slot's snapshot copies every table. Then it records the tables'
// membership rows.
func (p *parts) queueCopies(ctx context.Context, cfg Config, ckpts map[common.DispatcherID]common.Ts) error {
	p.copier = newCopier(p, cfg.Slot)
	p.members = newMembers(p, cfg.Slot)
	p.known = make(map[uint32]bool, len(p.info.Tables))
	for _, rel := range p.info.Tables {
		p.known[rel.OID] = true
	}
	pending, err := p.copier.pending(ctx)
	if err != nil {
		return err
	}
	current, err := p.source.Memberships(ctx)
	if err != nil {
		return err
	}
	if p.info.Created {
		return p.members.record(ctx, current)
	}
	recorded, err := p.members.load(ctx)
	if err != nil {
		return err
	}
	var owed []pgcodec.Relation
	var oids, written []uint32
	for _, rel := range p.info.Tables {
		_, listed := pending[rel.OID]
		_, ok := ckpts[dispatcherOf(rel.OID)]
		if ok {
			written = append(written, rel.OID)
		}
		if !ok || listed {
			owed = append(owed, rel)
			oids = append(oids, rel.OID)
		}
	}
	if recorded.publication != 0 && recorded.publication != current.Publication {
		p.log.Warn("the publication was created again since the last start (or the source upgraded): "+
			"a table removed from it and added again while serve was down cannot be told apart this time",
			zap.String("publication", cfg.Publication))
	}
	rejoined := rejoinedWhileDown(recorded, current, written)
	if err := p.copier.list(ctx, false, oids...); err != nil {
		return err
	}
	if err := p.copier.list(ctx, true, rejoined...); err != nil {
		return err
	}
	queue := make(map[uint32]bool, len(oids)+len(rejoined)) // table -> fresh
	for _, oid := range oids {
		queue[oid] = pending[oid]
	}
	again := make(map[uint32]bool, len(rejoined))
	for _, oid := range rejoined {
		queue[oid], again[oid] = true, true
	}
	for _, rel := range p.info.Tables {
		fresh, ok := queue[rel.OID]
		if !ok {
			continue
		}
		if again[rel.OID] {
			p.log.Warn("a table left the publication and joined it again while serve was down: copying it anew",
				zap.String("table", rel.QualifiedName()))
		}
		p.copier.add(rel, fresh)
	}
	return p.members.record(ctx, current)
}

// startOrResume opens the source and decides, with what the target
// holds, whether the changefeed resumes or starts over from a new
// snapshot. The sink's Start fenced out every earlier process of the
// changefeed before (none of their transactions commits after this), so
// what the target holds is final.
//
//   - The slot exists and its snapshot completed: resume.
//   - The slot exists but its snapshot never completed, or its first
//     position was never saved: the target may lack rows nobody will send
//     again. Start over: empty the target if the changefeed wrote there
//     (one transaction; else only forget its checkpoints and state),
//     forget the positions, drop the slot, create it again. Each step leaves a state
//     the next start recognises (a slot without a completed snapshot, a
//     slot without a position, no slot), so a start-over interrupted at
//     any point starts over again.
//   - A new slot on a target an earlier sink of this changefeed wrote to
//     (the owner's wrote marker, pgsink.Sink.Wrote): what the target holds
//     belongs to an earlier slot and would survive the snapshot (rows
//     deleted meanwhile); empty it first. On a target the changefeed never
//     wrote to (an earlier start that failed before writing included),
//     existing tables are left as they are; checkpoints and a
//     snapshot-done record there belong to an earlier slot and are
//     cleared, so that a crash during this slot's snapshot starts over
//     rather than resumes.
func (p *parts) startOrResume(ctx context.Context, cfg Config) error {
	setup := func(err error) error { return fmt.Errorf("%w: %w", ErrSetup, err) }
	done, _, err := p.sink.State(ctx, snapshotKey(cfg.Slot))
	if err != nil {
		return setup(err)
	}
	if done != "" {
		// A snapshot record is this slot's only if the slot existed
		// before it: one Open is about to create belongs to an earlier
		// slot, and is cleared before the slot exists, so that no
		// interruption after the creation can leave a new slot next to
		// an old record (the next start would resume without a snapshot).
		exists, err := pgsource.SlotExists(ctx, cfg.Source, cfg.Slot)
		if err != nil {
			return setup(err)
		}
		if !exists {
			if err := p.sink.SetState(ctx, snapshotKey(cfg.Slot), ""); err != nil {
				return setup(err)
			}
			done = ""
		}
	}
	err = p.openSource(ctx, cfg)
	dropSlot := false
	switch {
	case errors.Is(err, pgsource.ErrUnknownSlot) && done == "":
		dropSlot = true
	case err != nil:
		return err
	case !p.info.Created && done == "":
		dropSlot = true
	}
	if !dropSlot && !p.info.Created {
		return nil // resume
	}
	empty := p.sink.Wrote()
	switch {
	case dropSlot:
		p.log.Warn("the initial snapshot did not complete: starting over (dropping the slot)", zap.String("slot", cfg.Slot), zap.Bool("empty_target", empty))
		p.source.Close()
	case empty:
		p.log.Warn("a new slot on a target this changefeed wrote to before: emptying the target before the snapshot", zap.String("slot", cfg.Slot))
	}
	if empty {
		err = p.sink.Reset(ctx, p.info.Tables)
	} else {
		err = p.sink.ClearProgress(ctx)
	}
	if err != nil {
		return setup(err)
	}
	if !dropSlot {
		return nil
	}
	if err := p.positions.Forget(ctx, cfg.Slot); err != nil {
		return setup(err)
	}
	if err := pgsource.DropSlot(ctx, cfg.Source, cfg.Slot); err != nil {
		return setup(err)
	}
	return p.openSource(ctx, cfg)
}

// openSource builds and opens the source.
func (p *parts) openSource(ctx context.Context, cfg Config) error {
	var err error
	linger, poll := cfg.SourceReadLinger, cfg.PublicationPollInterval
	if linger == 0 {
		linger = -1 // off (pgsource's zero is its default)
	}
	if poll == 0 {
		poll = -1
	}
	receive := cfg.SourceReceiveTimeout
	if receive == 0 {
		receive = -1
	}
	p.source, err = pgsource.New(pgsource.Options{DSN: cfg.Source, Slot: cfg.Slot, Publication: cfg.Publication, TakeOver: true,
		ReadLinger: linger, ReceiveTimeout: receive, PublicationPollInterval: poll, Schema: p.schema, Positions: p.positions, SafePoint: p.sink.MinDurable, Logger: p.log, Registerer: p.reg,
		OnNewTable: func(rel pgcodec.Relation, firstTs common.Ts) {
			select {
			case p.newTables <- newTable{rel: rel, firstTs: firstTs}:
			case <-ctx.Done():
			}
		},
		OnRejoin: func(rel pgcodec.Relation) {
			select {
			case p.newTables <- newTable{rel: rel, rejoin: true}:
			case <-ctx.Done():
			}
		}})
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSetup, err)
	}
	if p.info, err = p.source.Open(ctx); err != nil {
		return fmt.Errorf("%w: %w", ErrSetup, err)
	}
	return nil
}

func snapshotKey(slot string) string { return "snapshot-done:" + slot }

// add binds a table to the sink and registers its dispatcher from start.
func (p *parts) add(ctx context.Context, rel pgcodec.Relation, start common.Ts) error {
	id := dispatcherOf(rel.OID)
	if err := p.sink.Bind(ctx, id, rel, start); err != nil {
		return err
	}
	return p.coll.AddDispatcher(ctx, id, common.TableSpan(int64(rel.OID)), start)
}

// addNewTables registers the tables the source finds while streaming.
func (p *parts) addNewTables(ctx context.Context) {
	// A table that could not be listed or bound (the target down) is
	// tried again: it is announced once, and the slot is held before it
	// until it is subscribed.
	var retry []newTable
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		var todo []newTable
		select {
		case <-ctx.Done():
			return
		case t := <-p.newTables:
			todo = []newTable{t}
		case <-tick.C:
			todo, retry = retry, nil
		}
		for _, t := range todo {
			if t.rejoin && p.known[t.rel.OID] {
				// Its changes while it was out of the publication are lost:
				// copied anew, emptied first.
				if err := p.rejoinTable(ctx, t.rel); err != nil {
					if ctx.Err() != nil {
						return
					}
					p.log.Error("copy a table that joined again: trying again in a second", zap.String("table", t.rel.QualifiedName()), zap.Error(err))
					retry = append(retry, t)
					continue
				}
				continue
			}
			if p.known[t.rel.OID] {
				continue // announced again (a restarted stream, or the poll and the stream both)
			}
			if err := p.addNewTable(ctx, t); err != nil {
				if ctx.Err() != nil {
					return
				}
				p.log.Error("add a new table: trying again in a second", zap.String("table", t.rel.QualifiedName()), zap.Error(err))
				retry = append(retry, t)
			}
		}
	}
}

// rejoinTable lists a bound table that joined the publication again for a
// fresh copy, records its new membership row (after the listing: see
// members) and queues the copy.
func (p *parts) rejoinTable(ctx context.Context, rel pgcodec.Relation) error {
	if err := p.copier.list(ctx, true, rel.OID); err != nil {
		return err
	}
	if err := p.recordMembership(ctx, rel.OID); err != nil {
		return err
	}
	p.copier.add(rel, true)
	return nil
}

// recordMembership records oid's current membership row.
func (p *parts) recordMembership(ctx context.Context, oid uint32) error {
	current, err := p.source.Memberships(ctx)
	if err != nil {
		return err
	}
	return p.members.recordOne(ctx, oid, current)
}

// addNewTable lists, binds, registers and queues the copy of a table that
// joined.
func (p *parts) addNewTable(ctx context.Context, t newTable) error {
	// A table the changefeed wrote before that joins now (it left the
	// publication before this start): its target rows may hold rows
	// deleted while it was out, so it is copied anew, emptied first.
	_, fresh := p.ckpts[dispatcherOf(t.rel.OID)]
	// Listed before it is bound: once bound, its checkpoint could make a
	// start take it for copied.
	if err := p.copier.list(ctx, fresh, t.rel.OID); err != nil {
		return err
	}
	if err := p.recordMembership(ctx, t.rel.OID); err != nil { // listed first: see members
		return err
	}
	if err := p.add(ctx, t.rel, t.firstTs-1); err != nil {
		return err
	}
	p.known[t.rel.OID] = true
	p.log.Info("replicating a new table", zap.String("table", t.rel.QualifiedName()), zap.Stringer("from", t.firstTs))
	p.copier.add(t.rel, fresh) // the rows it had when it joined
	return nil
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
	for {
		select {
		case <-ctx.Done():
			p.log.Info("stopping")
			p.stopBy = time.Now().Add(cfg.ShutdownTimeout)
			quiesced := p.quiesce(cfg.ShutdownTimeout / 2)
			if !snapshotRecorded && quiesced {
				// A snapshot applied in full since the last tick: recorded
				// now, or the next start would take it for interrupted and
				// copy every table again.
				p.recordSnapshotAtStop(cfg)
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
		}
		if cfg.ProgressInterval > 0 && !time.Now().Before(nextProgress) {
			prog.print()
			nextProgress = time.Now().Add(cfg.ProgressInterval)
		}
	}
}

// recordSnapshotAtStop records the initial snapshot as done after a clean
// stop's quiesce: every table was resolved to the last commit and the sink
// commits every checkpoint at once, so a snapshot the stream has passed is
// durable everywhere within moments (a wait bounded by a quarter of
// ShutdownTimeout; polled, the sink has no signal for it).
func (p *parts) recordSnapshotAtStop(cfg Config) {
	ctx, cancel := context.WithTimeout(context.Background(), min(cfg.ShutdownTimeout/4, time.Until(p.stopBy)))
	defer cancel()
	for {
		done, err := p.recordSnapshot(ctx, cfg)
		if done {
			return
		}
		if err == nil {
			t := time.NewTimer(10 * time.Millisecond)
			select {
			case <-t.C:
				continue
			case <-ctx.Done():
				t.Stop()
				err = ctx.Err()
			}
		}
		p.log.Warn("stopping without recording the initial snapshot as done: the next start copies every table again", zap.Error(err))
		return
	}
}

// recordSnapshot records the initial snapshot as done once every table's
// durable checkpoint has reached its ts, and says whether it did.
func (p *parts) recordSnapshot(ctx context.Context, cfg Config) (bool, error) {
	lo, ok := p.sink.MinDurable()
	if !ok || lo < p.info.SnapshotTs {
		return false, nil
	}
	if err := p.sink.SetState(ctx, snapshotKey(cfg.Slot), strconv.FormatUint(uint64(p.info.SnapshotTs), 10)); err != nil {
		return false, err
	}
	p.log.Info("initial snapshot applied")
	return true, nil
}

// quiesce ends the stream at its last commit for a clean stop: the sink
// commits every checkpoint at once from now on, and the source waits
// (within timeout) until every table has durably applied the last commit,
// then confirms it to the slot, so that the next start reads nothing
// again, and says whether it did. If it cannot (the target is down, a table is stopped), the slot
// keeps the position it had, as after a crash.
func (p *parts) quiesce(timeout time.Duration) bool {
	p.sink.Drain()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	quiesce := p.source.Quiesce
	if p.knobs != nil && p.knobs.quiesce != nil {
		quiesce = p.knobs.quiesce
	}
	if err := quiesce(ctx); err != nil {
		p.log.Warn("stopping without confirming the last commit to the slot: the next start reads the stream again from where it was last confirmed",
			zap.Error(err))
		return false
	}
	p.log.Info("the last commit is applied everywhere and confirmed to the slot")
	return true
}

// lag is how far the slowest table's durable checkpoint is behind now.
func (p *parts) lag() time.Duration {
	lo, ok := p.sink.MinDurable()
	if !ok {
		return 0
	}
	return lo.Lag(time.Now())
}

// closeBudget is how long close may take: what a clean stop has left of
// ShutdownTimeout (it began with the quiesce), or all of it when serve
// ends otherwise (an error, or a failed start).
func (p *parts) closeBudget(shutdown time.Duration) time.Duration {
	if p.stopBy.IsZero() {
		return shutdown
	}
	return max(0, time.Until(p.stopBy))
}

// close stops everything in reverse order, within timeout.
func (p *parts) close(timeout time.Duration) {
	p.cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if k := p.knobs; k != nil && k.closing != nil {
			k.closing() // first, so that a test can hold the close past its budget
		}
		if k := p.knobs; k != nil && k.closed != nil {
			defer k.closed()
		}
		if p.coll != nil {
			if err := p.coll.Close(); err != nil {
				p.log.Warn("close collector", zap.Error(err))
			}
		}
		if p.svc != nil {
			p.svc.Close()
		}
		if p.source != nil {
			p.source.Close()
		}
		if p.store != nil {
			_ = p.store.Close()
		}
		p.wg.Wait()
		if p.inproc != nil {
			p.inproc.Close()
		}
		if p.sink != nil {
			p.sink.Close()
		}
		if p.positions != nil {
			p.positions.Close()
		}
		if p.tmpDir {
			_ = os.RemoveAll(p.dataDir)
		}
	}()
	select {
	case <-done:
	case <-time.After(timeout):
		p.log.Error("shutdown timed out: closing did not end within what the stop had left of --shutdown-timeout", zap.Duration("left", timeout))
	}
}

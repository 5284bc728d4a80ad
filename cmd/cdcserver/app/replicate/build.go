package replicate

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"

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

// Start-up: building serve's parts and queueing the copies a start owes.

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
	// The changefeed's registration comes first: it names the slot's
	// owner before the slot or the publication is created.
	if err := p.pre.register(ctx, cfg); err != nil {
		return setup(err)
	}
	if p.sink, err = pgsink.New(pgsink.Options{DSN: cfg.Sink, Workers: cfg.SinkWorkers, FlushInterval: cfg.SinkFlushInterval, MaxFlushInterval: cfg.SinkMaxFlushInterval,
		CheckpointInterval: cfg.SinkCheckpointInterval, QueueBytes: cfg.SinkQueueSize, Owner: cfg.Slot, SoleOwner: true, Source: p.pre.source.Key(), Logger: p.log, Registerer: p.reg,
		Permit: cfg.permit(), FenceWait: cfg.fenceWait(), EndFenceHolders: cfg.fenceWait() > 0}); err != nil {
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
	storeDir := filepath.Join(p.dataDir, "eventstore")
	_ = os.RemoveAll(storeDir) // a cache: the slot is the durable log
	if p.store, err = eventstore.Open(storeOptions(cfg, eventstore.Options{Dir: storeDir, Upstream: p.source, Registerer: p.reg, Logger: p.log})); err != nil {
		return setup(err)
	}
	if err := p.store.Start(); err != nil {
		return setup(err)
	}
	if p.inproc, err = messaging.NewInProcess(messaging.InProcessOptions{Capacity: 8192, MaxBytes: inboxBytes(cfg), Logger: p.log}); err != nil {
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

// inboxBytes bounds the bytes of the messages between the event service and
// the collector: an eighth of the sink's queue (--sink-queue-size), so that
// a changefeed holds its in-flight rows by bytes, whatever their width. The
// sink's queue is where rows wait for the target; the inbox only hands them
// over, and the collector holds one drained batch besides (up to what the
// inbox held), so a changefeed holds about 1.25 times the queue size in
// rows. A count of messages alone (8192) let scans of wide rows pile up in
// a backlog (docs/benchmarks.md, a node's memory per changefeed). At least
// eventservice.DefaultLargeTxnSplitBytes, the most a scan task sends at
// once but one row, so that tasks still follow each other into the inbox
// under a small queue size; a task or a row beyond the bound goes in alone
// (messaging.InProcessOptions.MaxBytes), so nothing waits for good.
func inboxBytes(cfg Config) int {
	return int(min(max(cfg.SinkQueueSize/inboxShare, eventservice.DefaultLargeTxnSplitBytes), math.MaxInt32))
}

// inboxShare: the inbox holds 1/inboxShare of the sink's queue size.
const inboxShare = 8

// storeOptions are o with the embedding's block cache and memtable size
// (serve's own run: the store's defaults, a cache of its own).
func storeOptions(cfg Config, o eventstore.Options) eventstore.Options {
	if e := cfg.embedding; e != nil {
		o.Cache, o.MemTableBytes = e.StoreCache, e.StoreMemTableBytes
	}
	return o
}

// queueCopies queues the copies a start owes: on a resumed slot, the
// published tables the target lists as not yet copied, those without a
// checkpoint (they joined while no serve ran) and, anew, those that left
// the publication and joined it again while no serve ran (members.go). A
// new slot's snapshot copies every table. Then it records the tables'
// membership rows.
func (p *parts) queueCopies(ctx context.Context, cfg Config, ckpts map[common.DispatcherID]common.Ts) error {
	p.copier = newCopier(p, cfg.Slot, cfg.copySettleInterval)
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

// openDataDir prepares the event store's directory and takes its lock,
// before a start changes anything on either database: a --data-dir
// another running serve holds is refused while that serve still runs (it
// was checked after the fence, which had already superseded it). A
// temporary one is removed by close; the stale ones of killed serves by
// this start.
func (p *parts) openDataDir(cfg Config) error {
	var err error
	p.dataDir = cfg.DataDir
	if p.dataDir == "" {
		for _, dir := range removeStaleTempDirs(os.TempDir()) {
			p.log.Info("removed the event store an earlier serve left behind (it was killed)", zap.String("dir", dir))
		}
		if p.dataDir, err = os.MkdirTemp("", tempDirPrefix); err != nil {
			return err
		}
		p.tmpDir = true
	}
	// Held while serve runs: a start finds an unheld one stale
	// (datadir.go), and two serves never share a store.
	if err := os.MkdirAll(p.dataDir, 0o700); err != nil {
		return err
	}
	lock, ok, err := lockDataDir(p.dataDir)
	switch {
	case err != nil:
		return err
	case !ok:
		return fmt.Errorf("--data-dir %s is another running serve's", p.dataDir)
	}
	p.dirLock = lock
	return nil
}

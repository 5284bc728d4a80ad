// The --role collector process (RunCollector): the collectors of some
// changefeeds in a process of their own, connected to the service over
// gRPC, applying to durable sinks in their data dir and registering their
// dispatchers again after a reconnect.

package synthetic

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"time"

	"github.com/pingcap/log"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/cdcflow/eventservice/internal/backoff"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventcollector"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/pebblesink"
	"github.com/cdcflow/eventservice/pkg/remote"
)

// CollectorSummary is what a collector process prints on stdout (one JSON
// object) when it stops.
type CollectorSummary struct {
	Feeds       []int  `json:"feeds"`
	Dispatchers int    `json:"dispatchers"`
	RowsApplied uint64 `json:"rows_applied"`
	Resets      uint64 `json:"resets"`
	// Reconnects counts data streams opened after the first; Reregistered
	// the dispatchers registered again (new registration, from their
	// checkpoints) because of them.
	Reconnects   int64 `json:"reconnects"`
	Reregistered int64 `json:"reregistered"`
	// Resumed counts dispatchers that started from a checkpoint their sink
	// had from an earlier run of this process (a restart).
	Resumed     int    `json:"resumed"`
	MetricsAddr string `json:"metrics_addr,omitempty"`
}

// remoteFeed is one changefeed served by a collector process.
type remoteFeed struct {
	feed   int
	client *remote.Client
	coll   *eventcollector.Collector
	sink   *pebblesink.Sink
	ids    []common.DispatcherID
	// startTs is where a dispatcher with no checkpoint in the sink starts.
	startTs common.Ts
	// reregistered counts dispatchers registered again after reconnects.
	reregistered int64
}

// sinkDir is where a collector process keeps changefeed feed's sink.
func sinkDir(dataDir string, feed int) string {
	return filepath.Join(dataDir, fmt.Sprintf("sink-%d", feed))
}

// targetOf names changefeed feed's target (1-based).
func targetOf(feed int) messaging.Target { return messaging.Target(fmt.Sprintf("changefeed-%d", feed)) }

// RunCollector runs the collector role: for each changefeed in cfg.Feeds a
// gRPC client of the service at cfg.Connect, a collector whose dispatchers
// take their tables over at the service (a restart takes over what the
// last run registered), and a durable sink in cfg.DataDir from whose
// checkpoints the dispatchers resume. After a reconnect every dispatcher
// of the feed is registered again from its checkpoint under a new
// registration. It runs until ctx is cancelled (SIGTERM), then stops
// everything, prints its summary and returns it.
func RunCollector(ctx context.Context, cfg Config, stdout, stderr io.Writer) (CollectorSummary, error) {
	if err := cfg.Validate(); err != nil {
		return CollectorSummary{}, err
	}
	if cfg.Role != RoleCollector {
		return CollectorSummary{}, fmt.Errorf("%w: RunCollector needs --role collector", ErrInvalidConfig)
	}
	lg, _, err := log.InitLoggerWithWriteSyncer(&log.Config{Level: cfg.LogLevel, Format: "text"}, zapcore.AddSync(stderr), zapcore.AddSync(stderr))
	if err != nil {
		return CollectorSummary{}, fmt.Errorf("logger: %w", err)
	}
	lg = lg.Named("collector")
	tlsCfg, err := clientTLS(cfg, lg)
	if err != nil {
		return CollectorSummary{}, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	feeds, _ := parseFeeds(cfg.Feeds, cfg.Changefeeds) // validated
	var (
		rfs []*remoteFeed
		wg  sync.WaitGroup
	)
	// Stop in reverse: watchers, collectors, clients, sinks.
	runCtx, cancel := context.WithCancel(ctx)
	defer func() {
		cancel()
		wg.Wait()
		for _, rf := range rfs {
			if rf.coll != nil {
				if err := rf.coll.Close(); err != nil {
					lg.Warn("close collector", zap.Error(err))
				}
			}
			if rf.client != nil {
				rf.client.Close()
			}
			if rf.sink != nil {
				_ = rf.sink.Close()
			}
		}
	}()
	metrics, err := serveMetricsOf(cfg.MetricsAddr, reg, lg)
	if err != nil {
		return CollectorSummary{}, err
	}
	defer metrics.close()
	sum := CollectorSummary{Feeds: feeds, MetricsAddr: metrics.addr()}
	for _, feed := range feeds {
		rf := &remoteFeed{feed: feed, startTs: common.Ts(cfg.StartTs)}
		rfs = append(rfs, rf)
		if rf.sink, err = pebblesink.Open(sinkDir(cfg.DataDir, feed)); err != nil {
			return sum, err
		}
		if rf.client, err = remote.NewClient(remote.ClientOptions{Addr: cfg.Connect, Target: targetOf(feed),
			Capacity: cfg.InboxCapacity, TLS: tlsCfg, Logger: lg, Registerer: reg}); err != nil {
			return sum, err
		}
		if rf.coll, err = eventcollector.New(eventcollector.Options{Service: rf.client, Inbox: rf.client.Inbox(),
			Sink: rf.sink, Registerer: reg, Logger: lg, TakeOver: true, ExpectedDispatchers: cfg.Tables}); err != nil {
			return sum, err
		}
		if err := rf.client.Start(); err != nil {
			return sum, err
		}
		if err := rf.coll.Start(); err != nil {
			return sum, err
		}
		specs := make([]eventcollector.DispatcherSpec, 0, cfg.Tables)
		for t := 1; t <= cfg.Tables; t++ {
			id := common.DispatcherID{Hi: uint64(feed), Lo: uint64(t)}
			rf.sink.Bind(id, int64(t))
			rf.ids = append(rf.ids, id)
			start := rf.startTs
			if ckpt, err := rf.sink.CheckpointOf(id); err != nil {
				return sum, err
			} else if ckpt > start {
				start = ckpt
				sum.Resumed++
			}
			specs = append(specs, eventcollector.DispatcherSpec{ID: id, Span: common.TableSpan(int64(t)), StartTs: start})
		}
		if err := addAllWithRetry(runCtx, rf.coll, specs); err != nil {
			return sum, err
		}
		sum.Dispatchers += len(rf.ids)
		lg.Info("changefeed registered", zap.Int("feed", feed), zap.Int("dispatchers", len(rf.ids)))
		wg.Go(func() { reregisterOnReconnect(runCtx, rf, lg) })
	}
	fmt.Fprintf(stderr, "collector: serving changefeeds %v (%d dispatchers) from %s; metrics at %s\n", feeds, sum.Dispatchers, cfg.Connect, orNone(sum.MetricsAddr))
	<-ctx.Done()
	cancel()
	wg.Wait()
	for _, rf := range rfs {
		st := rf.coll.Counters()
		sum.RowsApplied += st.RowsApplied
		sum.Resets += st.TotalResets()
		sum.Reconnects += max(rf.client.Streams()-1, 0)
		sum.Reregistered += rf.reregistered
	}
	if err := json.NewEncoder(stdout).Encode(sum); err != nil {
		return sum, err
	}
	return sum, nil
}

// addAllWithRetry registers dispatchers in batches (one control call per
// messaging.MaxRegisterBatch), retrying those the service could not be
// asked (it may not be up yet, or the connection is being rebuilt) with a
// doubling delay (20ms to 1s, shortened by up to 20% at random: the
// collectors of a service that is not up yet all wait for it), until ctx
// ends. Any other refusal is the error.
func addAllWithRetry(ctx context.Context, coll *eventcollector.Collector, specs []eventcollector.DispatcherSpec) error {
	pause := backoff.Backoff{Base: 20 * time.Millisecond, Max: time.Second, Jitter: 0.2}
	for {
		var retry []eventcollector.DispatcherSpec
		for i, err := range coll.AddDispatchers(ctx, specs) {
			switch {
			case err == nil:
			case errors.Is(err, messaging.ErrUnavailable):
				retry = append(retry, specs[i])
			default:
				return err
			}
		}
		if len(retry) == 0 {
			return nil
		}
		specs = retry
		t := time.NewTimer(pause.Next()) // a retry delay, not synchronisation
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// reregisterOnReconnect registers every dispatcher of rf again from its
// checkpoint after each reconnect: what the broken stream lost is sent
// again, and the old registrations' messages are ignored.
func reregisterOnReconnect(ctx context.Context, rf *remoteFeed, lg *zap.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-rf.client.Reconnected():
		}
		lg.Info("reconnected: registering the changefeed's dispatchers again", zap.Int("feed", rf.feed))
		// The collector forgets its dispatchers without a control call
		// each (TakeOver: the new registrations, a batch per call, end
		// the service's old ones).
		for i, err := range rf.coll.ForgetDispatchers(ctx, rf.ids) {
			if err != nil && ctx.Err() == nil && !errors.Is(err, eventcollector.ErrUnknownDispatcher) {
				lg.Debug("reconnect: forget", zap.Stringer("dispatcher", rf.ids[i]), zap.Error(err))
			}
		}
		specs := make([]eventcollector.DispatcherSpec, 0, len(rf.ids))
		for _, id := range rf.ids {
			ckpt, err := rf.sink.CheckpointOf(id)
			if err != nil {
				lg.Warn("reconnect: read checkpoint", zap.Stringer("dispatcher", id), zap.Error(err))
			}
			specs = append(specs, eventcollector.DispatcherSpec{ID: id, Span: common.TableSpan(int64(id.Lo)), StartTs: max(rf.startTs, ckpt)})
		}
		if err := addAllWithRetry(ctx, rf.coll, specs); err != nil {
			if ctx.Err() == nil {
				lg.Warn("reconnect: register", zap.Error(err))
			}
			return
		}
		rf.reregistered += int64(len(specs))
	}
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

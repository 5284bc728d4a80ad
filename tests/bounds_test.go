package tests

import (
	"math"
	"runtime/metrics"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/eventservice"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// sampler records, throughout a run, the sizes the architecture promises
// to bound: the preparation queues, the scan channel, the collector's inbox,
// the per-target resolved-ts pending sets and the heap. It samples on a
// ticker; it only measures, nothing waits on it.
type sampler struct {
	svc   *eventservice.Service
	inbox *messaging.Inbox
	reg   prometheus.Gatherer
	quit  chan struct{}
	done  chan struct{}

	mu    sync.Mutex
	peaks peaks
}

// peaks are the largest values seen.
type peaks struct {
	samples         int
	prepare, scan   int
	inbox           int
	resolvedPending int
	heapBytes       uint64
	notifications   uint64
}

const (
	sampleEvery = 2 * time.Millisecond
	// gatherEvery: a Prometheus gather walks every dispatcher several
	// times, so it runs one sample in gatherEvery (every 250ms).
	gatherEvery = 125
)

func startSampler(h *harness) *sampler {
	s := &sampler{svc: h.svc, inbox: h.inbox, reg: h.reg, quit: make(chan struct{}), done: make(chan struct{})}
	go s.run()
	return s
}

func (s *sampler) run() {
	defer close(s.done)
	t := time.NewTicker(sampleEvery)
	defer t.Stop()
	heap := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	for i := 0; ; i++ {
		select {
		case <-t.C:
		case <-s.quit:
			return
		}
		p := s.svc.Progress()
		n := s.inbox.Len()
		var pending int
		if i%gatherEvery == 0 {
			pending = resolvedPending(s.reg)
			metrics.Read(heap)
		}
		s.mu.Lock()
		s.peaks.samples++
		s.peaks.prepare = max(s.peaks.prepare, p.PendingPrepare)
		s.peaks.scan = max(s.peaks.scan, p.PendingScan)
		s.peaks.inbox = max(s.peaks.inbox, n)
		s.peaks.resolvedPending = max(s.peaks.resolvedPending, pending)
		if heap[0].Value.Kind() == metrics.KindUint64 {
			s.peaks.heapBytes = max(s.peaks.heapBytes, heap[0].Value.Uint64())
		}
		s.peaks.notifications = p.Notifications
		s.mu.Unlock()
	}
}

// stop ends sampling; idempotent.
func (s *sampler) stop() {
	select {
	case <-s.quit:
	default:
		close(s.quit)
	}
	<-s.done
}

func (s *sampler) get() peaks {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peaks
}

// resolvedPending returns the keys held by the service's resolved-ts
// pending sets (all targets), from the registry.
func resolvedPending(g prometheus.Gatherer) int {
	mfs, err := g.Gather()
	if err != nil {
		return 0
	}
	n := 0
	for _, mf := range mfs {
		if mf.GetName() != "cdcflow_eventservice_resolved_set_pending_keys" {
			continue
		}
		for _, m := range mf.GetMetric() {
			n += int(m.GetGauge().GetValue())
		}
	}
	return n
}

// requireBounded checks the sampled peaks against the bounds of guarantee 7
// and 2: a dispatcher is in at most one preparation queue entry and one
// resolved-ts pending key, the scan channel holds at most its capacity plus
// one session per waiting preparation worker, and the inbox at most its
// capacity. (The service's PendingScan gauge is decremented by a scan worker
// just after it took a session from the channel, so it may also count one
// session per scan worker: that is the bound's last term.) With more notifications than dispatchers, a queue that grew
// per notification would break the first bound.
func (h *harness) requireBounded() peaks {
	h.t.Helper()
	p := h.samp.get()
	live := h.peakLive()
	h.t.Logf("peaks over %d samples: prepare %d, scan %d, inbox %d, resolved pending %d, heap %.1f MiB; notifications %d, dispatchers %d",
		p.samples, p.prepare, p.scan, p.inbox, p.resolvedPending, float64(p.heapBytes)/(1<<20), p.notifications, live)
	require.Greater(h.t, p.samples, 10, "the sampler must have run throughout")
	require.LessOrEqual(h.t, p.prepare, live, "preparation queues hold at most one entry per dispatcher")
	require.LessOrEqual(h.t, p.resolvedPending, live, "resolved-ts pending sets hold at most one key per dispatcher")
	require.LessOrEqual(h.t, p.scan, h.svcOpt.ScanQueueSize+h.svcOpt.PrepareWorkers+h.svcOpt.ScanWorkers, "scan channel bound")
	require.LessOrEqual(h.t, p.inbox, h.cfg.capacity, "inbox bound")
	return p
}

// histogram returns the sample count and sum of the histogram name.
func histogram(g prometheus.Gatherer, name string) (uint64, float64) {
	mfs, err := g.Gather()
	if err != nil {
		return 0, 0
	}
	var n uint64
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			n += m.GetHistogram().GetSampleCount()
			sum += m.GetHistogram().GetSampleSum()
		}
	}
	return n, sum
}

// The runtime's histograms of the two ways a running
// callback is held up by the runtime rather than by what it does: waiting,
// runnable, for a CPU (/sched/latencies) and a stop-the-world pause of the
// GC, including the time taken to stop every thread
// (/sched/pauses/total/gc). Both are sampled by the runtime itself.
const (
	schedLatencyMetric = "/sched/latencies:seconds"
	gcPauseMetric      = "/sched/pauses/total/gc:seconds"
)

// stallSnapshot is the state of both stall histograms at one moment.
type stallSnapshot [2]*metrics.Float64Histogram

// readStalls returns the current stall histograms.
func readStalls() stallSnapshot {
	samples := [2]metrics.Sample{{Name: schedLatencyMetric}, {Name: gcPauseMetric}}
	metrics.Read(samples[:])
	var snap stallSnapshot
	for i := range samples {
		snap[i] = samples[i].Value.Float64Histogram()
	}
	return snap
}

// worstStallSince returns, over both stall histograms, the upper bound of the
// highest bucket that gained samples since before: the longest the runtime
// kept a goroutine from running meanwhile.
func worstStallSince(before stallSnapshot) time.Duration {
	after := readStalls()
	var worst float64
	for m := range after {
		for i, c := range after[m].Counts {
			if i >= len(before[m].Counts) || c <= before[m].Counts[i] {
				continue
			}
			upper := after[m].Buckets[i+1]
			if math.IsInf(upper, 1) {
				upper = after[m].Buckets[i]
			}
			worst = max(worst, upper)
		}
	}
	return time.Duration(worst * float64(time.Second))
}

package replicate

import (
	"fmt"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cdcflow/eventservice/internal/promutil"
	"github.com/cdcflow/eventservice/pkg/common"
)

// What serve tells an operator about itself: its phase, whether it is
// ready, how far behind it is (the progress line, /readyz, metrics).

// phase is where a changefeed is in its life.
type phase int32

const (
	phaseStarting      phase = iota // building: checks, fence, slot, store, bind
	phaseSnapshot                   // the initial snapshot is being read from the source
	phaseSnapshotApply              // read, not yet durable in the target
	phaseStreaming                  // every table is copied; changes stream
	phaseStopping                   // a clean stop began
)

var phaseNames = []string{"starting", "snapshot", "snapshot_apply", "streaming", "stopping"}

func (ph phase) String() string { return phaseNames[ph] }

// health is serve's view of itself, read by /readyz, the metrics and the
// progress line; the loop writes it.
type health struct {
	phase atomic.Int32
	// snapshotApplied: the initial snapshot is durable in the target (or
	// there was none to take).
	snapshotApplied atomic.Bool
}

func (h *health) setPhase(ph phase) { h.phase.Store(int32(ph)) }
func (h *health) current() phase    { return phase(h.phase.Load()) }

// phaseOf is the phase after a tick of the loop, from what the source
// and the snapshot's record say.
func phaseOf(stopping, snapshotRunning, snapshotApplied bool) phase {
	switch {
	case stopping:
		return phaseStopping
	case snapshotRunning:
		return phaseSnapshot
	case !snapshotApplied:
		return phaseSnapshotApply
	default:
		return phaseStreaming
	}
}

// lag is how long the oldest change decoded and not yet durable in the
// target has waited (0: all applied). Before, it was the age of the
// lowest durable checkpoint, which an idle table's checkpoint (written
// once a second, behind a resolved-ts of up to a second) made 1-2 s on an
// idle changefeed, more than a busy one's.
func (p *parts) lag() time.Duration {
	return p.source.Lag(func(oid uint32) (common.Ts, bool) {
		d := p.sink.Durable(dispatcherOf(oid))
		return d, d != 0
	}, time.Now())
}

// notReady lists why serve is not ready: the initial snapshot not yet
// applied on the target (so the target is no cut-over point), the
// source's stream or the sink not connected, a table stopped, or the lag
// above maxLag.
func (p *parts) notReady(maxLag time.Duration) []string {
	var why []string
	switch ph := p.health.current(); ph {
	case phaseStarting, phaseStopping:
		why = append(why, "serve is "+ph.String())
	case phaseSnapshot, phaseSnapshotApply:
		snap := p.source.Snapshot()
		why = append(why, fmt.Sprintf("the initial snapshot is not yet applied on the target (%s: %d of %d tables read, %d rows)",
			ph, snap.TablesDone, snap.Tables, snap.Rows))
	}
	if err := p.source.Err(); err != nil {
		why = append(why, "source stopped: "+err.Error())
	} else if !p.source.Streaming() {
		why = append(why, "source stream not connected")
	}
	if !p.sink.Connected() {
		why = append(why, "sink not connected")
	}
	if stopped := p.sink.Stopped(); len(stopped) > 0 {
		why = append(why, fmt.Sprintf("%d tables stopped (first: %s)", len(stopped), stopped[0]))
	}
	if lag := p.lag(); lag > maxLag {
		why = append(why, fmt.Sprintf("lag %v above %v", lag.Round(time.Millisecond), maxLag))
	}
	return why
}

// serveMetrics are serve's own (cdcflow_serve_*).
type serveMetrics struct {
	lag, ready prometheus.GaugeFunc
	phase      *prometheus.GaugeVec
	released   prometheus.Counter
}

func newServeMetrics(p *parts, cfg Config) (*serveMetrics, error) {
	m := &serveMetrics{
		lag: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "cdcflow", Subsystem: "serve", Name: "lag_seconds",
			Help: "How long the oldest change decoded from the source and not yet durable in the target has waited (0: everything decoded is applied)."},
			func() float64 { return p.lag().Seconds() }),
		ready: prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "cdcflow", Subsystem: "serve", Name: "ready",
			Help: "1 when /readyz answers ready: the snapshot applied, both sides connected, no table stopped, the lag within --ready-lag."},
			func() float64 {
				if len(p.notReady(cfg.ReadyLag)) == 0 {
					return 1
				}
				return 0
			}),
		phase: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "cdcflow", Subsystem: "serve", Name: "phase",
			Help: "1 for the changefeed's current phase: starting, snapshot (read from the source), snapshot_apply (not yet durable in the target), streaming, stopping."},
			[]string{"phase"}),
		released: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "cdcflow", Subsystem: "serve", Name: "released_tables_total",
			Help: "Stopped tables whose hold on the slot was released because it retained more than --max-retained-wal: their checkpoint dropped, a fresh copy owed."}),
	}
	for _, name := range phaseNames {
		m.phase.WithLabelValues(name)
	}
	return m, promutil.RegisterAll(p.reg, m.lag, m.ready, m.phase, m.released)
}

// setPhase records the phase in health and the gauge.
func (p *parts) setPhase(ph phase) {
	p.health.setPhase(ph)
	if p.met == nil {
		return
	}
	for i, name := range phaseNames {
		v := 0.0
		if phase(i) == ph {
			v = 1
		}
		p.met.phase.WithLabelValues(name).Set(v)
	}
}

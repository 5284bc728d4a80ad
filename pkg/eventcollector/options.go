package eventcollector

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/optcheck"
	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventservice"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// ServiceAPI is what a collector needs of the event service; the
// *eventservice.Service implements it. It is declared here, on the consumer
// side, so tests can stand in a recording double.
type ServiceAPI interface {
	Register(info eventservice.DispatcherInfo) error
	Reset(id common.DispatcherID, epoch uint64, startTs common.Ts) error
	Remove(id common.DispatcherID) error
	Heartbeat(id common.DispatcherID, epoch uint64, checkpoint common.Ts) error
}

var _ ServiceAPI = (*eventservice.Service)(nil)

// Options configures a Collector. Zero fields take the documented defaults;
// New validates and reports every bad field at once.
type Options struct {
	// Service is the event service the dispatchers register with.
	// Required.
	Service ServiceAPI
	// Inbox is the collector's receiving end (messaging.InProcess.Register).
	// Required. The collector is its only reader.
	Inbox *messaging.Inbox
	// Target is the name the service sends this collector's messages to.
	// Default Inbox.Target(); if set, it must equal it.
	Target messaging.Target
	// Sink receives the dispatchers' changes. Required.
	Sink Sink
	// HeartbeatInterval is the period of checkpoint heartbeats and of
	// retries of failed resets. Default 200ms, TiCDC's collector period: the
	// store's GC and the service's view of progress lag by at most this.
	HeartbeatInterval time.Duration
	// MaxDrain is the most messages taken from the inbox at once, the
	// collector's only buffer. Default 256: large enough to amortise the
	// inbox lock, small next to the inbox capacity, so a slow sink leaves the
	// messages in the bounded inbox, where they push back on the service.
	MaxDrain int
	// Clock drives heartbeats and the checkpoint-lag gauge. Default the
	// real clock.
	Clock clock.Clock
	// Logger receives the collector's logs. Default zap.NewNop().
	Logger *zap.Logger
	// Registerer receives the collector's metrics, labelled with the target.
	// Default nil: none.
	Registerer prometheus.Registerer
}

// Defaults.
const (
	DefaultHeartbeatInterval = 200 * time.Millisecond
	DefaultMaxDrain          = 256
	// maxMaxDrain bounds MaxDrain: a drained batch is held in memory.
	maxMaxDrain = 1 << 20
)

// EnsureDefaults fills zero fields with their defaults.
func (o Options) EnsureDefaults() Options {
	if o.Target == "" && o.Inbox != nil {
		o.Target = o.Inbox.Target()
	}
	if o.HeartbeatInterval == 0 {
		o.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if o.MaxDrain == 0 {
		o.MaxDrain = DefaultMaxDrain
	}
	o.Clock = clock.OrReal(o.Clock)
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	return o
}

// Validate reports every invalid field, each wrapping ErrInvalidOptions. It
// expects defaults filled in.
func (o Options) Validate() error {
	p := optcheck.New(ErrInvalidOptions)
	p.Required("Service", o.Service)
	p.Required("Inbox", o.Inbox)
	p.Required("Sink", o.Sink)
	p.NotTypedNil("Registerer", o.Registerer)
	switch {
	case o.Target == "":
		p.Addf("Target is empty")
	case o.Inbox != nil && o.Inbox.Target() != o.Target:
		p.Addf("Target %q is not the inbox's target %q", o.Target, o.Inbox.Target())
	}
	p.Require(o.HeartbeatInterval > 0, "HeartbeatInterval %v is not positive", o.HeartbeatInterval)
	p.IntRange("MaxDrain", o.MaxDrain, 1, maxMaxDrain)
	p.Required("Clock", o.Clock)
	p.Require(o.Logger != nil, "Logger is nil")
	return p.Err()
}

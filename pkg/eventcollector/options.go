package eventcollector

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/optcheck"
	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// Options configures a Collector. Zero fields take the documented defaults;
// New validates and reports every bad field at once.
type Options struct {
	// Service is the event service's control plane, which the dispatchers
	// register with (in-process: the *eventservice.Service itself; across
	// processes: a client of a network transport). Required.
	Service messaging.ControlPlane
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
	// RequestTimeout bounds each control-plane call the collector makes on
	// its own (reset retries, heartbeats); AddDispatcher and
	// RemoveDispatcher use their caller's context. Default 10s: an
	// in-process call never comes near it; a network call to a dead peer
	// gives up and is retried at the next heartbeat tick.
	RequestTimeout time.Duration
	// Clock drives heartbeats and the checkpoint-lag gauge. Default the
	// real clock.
	Clock clock.Clock
	// Logger receives the collector's logs. Default zap.NewNop().
	Logger *zap.Logger
	// Registerer receives the collector's metrics, labelled with the target.
	// Default nil: none.
	Registerer prometheus.Registerer
	// TakeOver makes every registration take its dispatcher over at the
	// service (messaging.RegisterRequest.Replace): a registration the
	// service still holds for the ID, which this collector does not know
	// (it restarted, or its connection broke), is removed first. For a
	// collector in another process; default false, so that a second
	// collector adding the same ID by mistake gets ErrDispatcherExists.
	TakeOver bool
	// ExpectedDispatchers is a size hint: the collector's index of
	// dispatchers (by ID and by slot) is allocated at New for this many,
	// so that adding them does not rehash it as it grows. It is not a
	// limit. Default 0: the index starts small and grows.
	ExpectedDispatchers int
}

// Defaults.
const (
	DefaultHeartbeatInterval = 200 * time.Millisecond
	DefaultMaxDrain          = 256
	DefaultRequestTimeout    = 10 * time.Second
	// maxMaxDrain bounds MaxDrain: a drained batch is held in memory.
	maxMaxDrain = 1 << 20
	// maxExpectedDispatchers bounds the ExpectedDispatchers hint (the
	// memory it takes at New).
	maxExpectedDispatchers = 1 << 24
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
	if o.RequestTimeout == 0 {
		o.RequestTimeout = DefaultRequestTimeout
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
	p.IntRange("ExpectedDispatchers", o.ExpectedDispatchers, 0, maxExpectedDispatchers)
	p.Require(o.RequestTimeout > 0, "RequestTimeout %v is not positive", o.RequestTimeout)
	p.Required("Clock", o.Clock)
	p.Require(o.Logger != nil, "Logger is nil")
	return p.Err()
}

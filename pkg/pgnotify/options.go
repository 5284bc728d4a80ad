package pgnotify

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/pendingset"
)

// Defaults of ListenOptions.
const (
	DefaultRetryBase = 50 * time.Millisecond
	DefaultRetryMax  = 5 * time.Second
)

// Options configure a Publisher.
type Options struct {
	// DSN is the connection string (pgx syntax). Required.
	DSN string
	// MaxBatch is the most notifications in one statement. Default 512.
	MaxBatch int
	// Connections is how many statements may be in flight at once, each on
	// a connection of its own (the pending set's MaxInFlight: the batches
	// in flight hold disjoint keys, so a key's notifications stay in
	// order). One statement at a time caps a publisher at MaxBatch per
	// round trip. Default 1, at most MaxConnections.
	Connections int
	// Logger defaults to zap.NewNop(); Registerer (nil: no metrics) gets
	// the pending set's metrics under the prefix "pgnotify"; Clock defaults
	// to the real clock.
	Logger     *zap.Logger
	Registerer prometheus.Registerer
	Clock      clock.Clock
	// ConstLabels are attached to every metric, so that several publishers
	// can share a Registerer.
	ConstLabels prometheus.Labels
}

// EnsureDefaults returns a copy of o with every zero field set to its
// documented default.
func (o Options) EnsureDefaults() Options {
	if o.MaxBatch == 0 {
		o.MaxBatch = pendingset.DefaultMaxBatch
	}
	if o.Connections == 0 {
		o.Connections = 1
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	o.Clock = clock.OrReal(o.Clock)
	return o
}

// Validate reports every invalid field, each wrapping ErrInvalidOptions. It
// expects defaults filled in (EnsureDefaults).
func (o Options) Validate() error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidOptions}, args...)...))
	}
	if o.DSN == "" {
		bad("DSN is required")
	} else if _, err := pgx.ParseConfig(o.DSN); err != nil {
		bad("DSN: %v", err)
	}
	if o.MaxBatch < 0 {
		bad("MaxBatch %d is negative", o.MaxBatch)
	}
	if o.Connections < 0 || o.Connections > MaxConnections {
		bad("Connections %d not in 0..%d", o.Connections, MaxConnections)
	}
	return errors.Join(errs...)
}

// ListenOptions configure Listen.
type ListenOptions struct {
	// DSN is the connection string (pgx syntax). Required.
	DSN string
	// Channels are LISTENed to after every (re)connect. At least one.
	Channels []string
	// OnConnect runs after every successful (re)connect and LISTEN, before
	// any notification is handed out: NOTIFY is not durable, so a listener
	// that was away re-reads the state it follows here. An error drops the
	// connection and retries after the back-off. It runs on Listen's
	// goroutine, holding no lock, with notifications held back until it
	// returns.
	OnConnect func(ctx context.Context) error
	// OnNotify receives each notification, in order, on Listen's goroutine
	// and holding no lock. Required. While it runs the next notification
	// waits (in the connection's buffer, then in the server's notification
	// queue, which is bounded: once a lagging listener has filled it, the
	// senders' NOTIFYs fail), so it should record and return.
	OnNotify func(channel, payload string)
	// RetryBase and RetryMax bound the reconnect back-off (doubling).
	// Defaults 50ms and 5s.
	RetryBase, RetryMax time.Duration
	// Logger defaults to zap.NewNop(); Clock (the back-off's) to the real
	// clock.
	Logger *zap.Logger
	Clock  clock.Clock
}

// EnsureDefaults returns a copy of o with every zero field set to its
// documented default. A negative RetryBase or RetryMax takes the default
// too.
func (o ListenOptions) EnsureDefaults() ListenOptions {
	if o.RetryBase <= 0 {
		o.RetryBase = DefaultRetryBase
	}
	if o.RetryMax <= 0 {
		o.RetryMax = DefaultRetryMax
	}
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	o.Clock = clock.OrReal(o.Clock)
	return o
}

// Validate reports every problem: DSN, Channels and OnNotify missing
// (wrapping ErrInvalidOptions), and each channel that is empty, too long,
// not UTF-8 or holds a NUL (wrapping ErrInvalidChannel), joined. It
// expects defaults filled in (EnsureDefaults).
func (o ListenOptions) Validate() error {
	var errs []error
	if o.DSN == "" || len(o.Channels) == 0 || o.OnNotify == nil {
		errs = append(errs, fmt.Errorf("%w: Listen needs DSN, Channels and OnNotify", ErrInvalidOptions))
	}
	for _, c := range o.Channels {
		// pgx.Identifier.Sanitize drops NUL bytes: unchecked, "a\x00b"
		// would LISTEN to "ab".
		if err := checkChannel(c); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

package pgnotify

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/pendingset"
)

// MaxPayloadBytes is the largest payload PostgreSQL's NOTIFY accepts: it
// must be shorter than 8000 bytes (in the default configuration).
const MaxPayloadBytes = 7999

// MaxConnections bounds Options.Connections.
const MaxConnections = 64

// maxChannelBytes is PostgreSQL's identifier limit (NAMEDATALEN - 1).
const maxChannelBytes = 63

// notifySQL sends a whole batch in one statement.
const notifySQL = "SELECT pg_notify(c, p) FROM unnest($1::text[], $2::text[]) AS t(c, p)"

type pubKey struct{ channel, key string }

// Publisher is a non-blocking pg_notify publisher. Create with New, then
// Start; Close ends it.
type Publisher struct {
	opts   Options
	log    *zap.Logger
	set    *pendingset.Set[pubKey, string]
	pump   *pendingset.Pump[pubKey, string]
	closed atomic.Bool

	// connects counts connections made; statementErrors failed statements
	// by class (connection, rejected, other). The pending set's metrics
	// (prefix pgnotify_) count adds, deliveries and their durations.
	connects        prometheus.Counter
	statementErrors *prometheus.CounterVec
	// rejected counts notifications dropped because the server refused
	// their data even alone (see deliver).
	rejected prometheus.Counter

	// knobs are set by tests before Start; zero in production.
	knobs testingKnobs

	// free hands out the indexes of conns, one per delivery in flight (the
	// pump runs at most Connections at once, so taking one never waits).
	// conns[i] is nil until needed and after a failure; mu guards conns
	// against Close.
	free  chan int
	mu    sync.Mutex
	conns []*pgx.Conn
}

// testingKnobs are the publisher's test hooks, all in one place: tests
// set them before Start; in production they are zero and each costs one
// comparison.
type testingKnobs struct {
	// rejected runs on the delivering goroutine for every notification
	// dropped because the server refused its data (see reject).
	rejected func(channel, key string, err error)
}

// New validates opts and builds a publisher. It starts nothing.
func New(opts Options) (*Publisher, error) {
	opts = opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	p := &Publisher{opts: opts, log: opts.Logger.Named("pgnotify"),
		connects: prometheus.NewCounter(prometheus.CounterOpts{Name: "pgnotify_connects_total",
			Help: "Connections the publisher opened (the first, and one after each lost connection).", ConstLabels: opts.ConstLabels}),
		statementErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "pgnotify_statement_errors_total",
			Help:        "Failed notify statements, by class: connection (lost; batch retried), rejected (the server refused an entry; bisected), other.",
			ConstLabels: opts.ConstLabels}, []string{"class"}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{Name: "pgnotify_rejected_notifications_total",
			Help:        "Notifications dropped because the server refused their data (SQLSTATE class 22) in a statement of their own.",
			ConstLabels: opts.ConstLabels}),
	}
	set, err := pendingset.New(pendingset.Options[pubKey, string]{
		Merge:         func(_, newer string) string { return newer }, // newest payload wins
		MaxBatch:      opts.MaxBatch,
		MaxInFlight:   opts.Connections,
		Clock:         opts.Clock,
		Registerer:    opts.Registerer,
		MetricsPrefix: "pgnotify",
		ConstLabels:   opts.ConstLabels,
		Logger:        opts.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	if opts.Registerer != nil {
		own := []prometheus.Collector{p.connects, p.statementErrors, p.rejected}
		for i, c := range own {
			if err := opts.Registerer.Register(c); err != nil {
				for _, done := range own[:i] { // leave the names free for a retry
					opts.Registerer.Unregister(done)
				}
				set.Unregister()
				return nil, fmt.Errorf("%w: registering metrics (ConstLabels tell publishers apart): %w", ErrInvalidOptions, err)
			}
		}
	}
	p.set = set
	p.conns = make([]*pgx.Conn, opts.Connections)
	p.free = make(chan int, opts.Connections)
	for i := range opts.Connections {
		p.free <- i
	}
	if p.pump, err = pendingset.NewPump(set, p.deliver); err != nil {
		return nil, err
	}
	return p, nil
}

// Start starts the pump.
func (p *Publisher) Start() error {
	if p.closed.Load() {
		return ErrClosed
	}
	return p.pump.Start()
}

// Publish records payload as the newest notification for (channel, key)
// and returns at once; it never blocks. It refuses, with ErrPayloadTooLarge,
// ErrInvalidPayload or ErrInvalidChannel, what a UTF8 database would
// refuse (a database of another encoding may take more, but Go strings are
// UTF-8): accepted, such an entry would fail every batch it rode in until
// bisection isolated it. The key is not sent; it only decides what
// coalesces.
func (p *Publisher) Publish(channel, key, payload string) error {
	if p.closed.Load() {
		return ErrClosed
	}
	if err := checkPayload(channel, payload); err != nil {
		return err
	}
	if err := checkChannel(channel); err != nil {
		return err
	}
	p.set.Add(pubKey{channel, key}, payload)
	return nil
}

// Pending is the number of (channel, key) pairs not yet delivered.
func (p *Publisher) Pending() int { return p.set.Len() }

// Close stops publishing. With drain it first delivers what is pending
// (bounded by ctx); without, it stops at once and pending notifications
// are dropped with the process. Idempotent.
func (p *Publisher) Close(ctx context.Context, drain bool) error {
	if !p.closed.CompareAndSwap(false, true) {
		return nil
	}
	var err error
	if drain {
		if err = p.pump.Drain(ctx); errors.Is(err, pendingset.ErrNotStarted) {
			err = nil
		}
	} else {
		p.pump.Stop()
	}
	if r := p.opts.Registerer; r != nil { // a new publisher may take the names
		r.Unregister(p.connects)
		r.Unregister(p.statementErrors)
		r.Unregister(p.rejected)
		p.set.Unregister()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, conn := range p.conns {
		if conn != nil {
			_ = conn.Close(ctx)
			p.conns[i] = nil
		}
	}
	return err
}

// deliver sends one batch in one statement, connecting first if needed.
func (p *Publisher) deliver(ctx context.Context, batch []pendingset.Entry[pubKey, string]) error {
	slot := <-p.free
	defer func() { p.free <- slot }()
	conn, err := p.connection(ctx, slot)
	if err != nil {
		return fmt.Errorf("pgnotify: connect: %w", err)
	}
	channels := make([]string, len(batch))
	payloads := make([]string, len(batch))
	for i := range batch {
		channels[i], payloads[i] = batch[i].Key.channel, batch[i].Value
	}
	if _, err := conn.Exec(ctx, notifySQL, channels, payloads); err != nil {
		if pgErr, ok := isDataException(err); ok && !conn.IsClosed() {
			p.statementErrors.WithLabelValues("rejected").Inc()
			if len(batch) == 1 {
				// The entry fails alone, and would fail the same way on
				// every retry: drop it. As Delivered the set forgets it,
				// and a value published while it was in flight is sent
				// next. Quarantine (FailedKey) would retry it every
				// QuarantineRetry, hold the key's next, perhaps valid,
				// payload back until then, and leave Close(drain) with a
				// key it can never deliver.
				batch[0].Result = pendingset.Delivered
				p.reject(batch[0], pgErr)
				return nil
			}
			// Some entry's data: bisect until it stands alone (above);
			// every other entry is delivered.
			return pendingset.Permanent(err)
		}
		var pgErr *pgconn.PgError
		if conn.IsClosed() || !errors.As(err, &pgErr) {
			p.statementErrors.WithLabelValues("connection").Inc()
			p.dropConnection(slot, conn) // the connection is gone: reconnect next time
			return err
		}
		p.statementErrors.WithLabelValues("other").Inc()
		return err
	}
	return nil
}

// connection returns slot's connection, connecting if it has none. The
// connect runs outside mu, so that one slot's slow connect does not hold
// up the others.
func (p *Publisher) connection(ctx context.Context, slot int) (*pgx.Conn, error) {
	p.mu.Lock()
	conn := p.conns[slot]
	p.mu.Unlock()
	if conn != nil && !conn.IsClosed() {
		return conn, nil
	}
	conn, err := pgx.Connect(ctx, p.opts.DSN)
	if err != nil {
		return nil, err
	}
	p.connects.Inc()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.conns[slot] = conn // Close closes it: it waits for the pump, so for this delivery, first
	return conn, nil
}

// reject reports a notification dropped because the server refused its
// data: a metric, a warning naming it, and the tests' hook.
func (p *Publisher) reject(e pendingset.Entry[pubKey, string], pgErr *pgconn.PgError) {
	p.rejected.Inc()
	p.log.Warn("the server refused a notification's data; dropped",
		zap.String("channel", e.Key.channel), zap.String("key", e.Key.key), zap.Int("payload_bytes", len(e.Value)),
		zap.String("sqlstate", pgErr.Code), zap.String("message", pgErr.Message))
	if k := p.knobs.rejected; k != nil {
		k(e.Key.channel, e.Key.key, pgErr)
	}
}

func (p *Publisher) dropConnection(slot int, conn *pgx.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns[slot] == conn {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second) // a dead peer must not hold the pump
		defer cancel()
		_ = conn.Close(ctx)
		p.conns[slot] = nil
	}
}

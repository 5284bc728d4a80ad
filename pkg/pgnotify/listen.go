package pgnotify

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/backoff"
)

// Listen listens until ctx ends, reconnecting with back-off whenever the
// connection is lost; it returns ctx.Err(), or at once an ErrInvalidOptions
// error for bad options or an ErrInvalidChannel error for a channel that is
// empty, too long, not UTF-8 or holds a NUL, or that the database refuses
// for its data (SQLSTATE class 22: a character its encoding lacks, say),
// since no reconnect would change that. It runs on the caller's goroutine.
func Listen(ctx context.Context, o ListenOptions) error {
	o = o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return err
	}
	log := o.Logger.Named("pgnotify.listen")
	// No jitter: one listener per process, no herd to spread.
	reconnect := backoff.Backoff{Base: o.RetryBase, Max: o.RetryMax}
	for {
		err := listenOnce(ctx, o)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if errors.Is(err, ErrInvalidChannel) {
			return err
		}
		if errors.Is(err, errHealthy) {
			reconnect.Reset() // it ran fine before it broke
		}
		delay := reconnect.Next()
		log.Warn("listener connection lost; reconnecting", zap.Duration("in", delay), zap.Error(err))
		t := o.Clock.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C():
		}
	}
}

// errHealthy wraps the error that ended a connection which had been
// listening (as opposed to one that failed to set up).
var errHealthy = errors.New("pgnotify: connection was listening")

// listenOnce connects, LISTENs, runs OnConnect and hands out notifications
// until the connection fails or ctx ends.
func listenOnce(ctx context.Context, o ListenOptions) error {
	conn, err := pgx.Connect(ctx, o.DSN)
	if err != nil {
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), time.Second) // a dead peer must not hold us
		defer cancel()
		_ = conn.Close(cctx)
	}()
	for _, c := range o.Channels {
		if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{c}.Sanitize()); err != nil {
			if _, ok := isDataException(err); ok {
				return fmt.Errorf("%w: %q: refused by the database: %w", ErrInvalidChannel, c, err)
			}
			return err
		}
	}
	if o.OnConnect != nil {
		if err := o.OnConnect(ctx); err != nil {
			return fmt.Errorf("OnConnect: %w", err)
		}
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return fmt.Errorf("%w: %w", errHealthy, err)
		}
		o.OnNotify(n.Channel, n.Payload)
	}
}

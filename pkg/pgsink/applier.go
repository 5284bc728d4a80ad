package pgsink

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/internal/backoff"
)

// applier is a lane's I/O: its connection to the target and what it sends
// on it (a commit's pipeline, commit.go and pipeline.go; a warm-up,
// warm.go), and the reconnect when the target is lost. It decides nothing
// about when: the lane's policy does. The lane goroutine owns it; only
// down is read elsewhere (Sink.Connected).
type applier struct {
	s    *Sink
	n    int       // the lane's number
	conn *pgx.Conn // replaced by reconnect
	down atomic.Bool

	// What a commit sends with (pipeline.go): the pipeline it builds
	// (reused), the statements every commit may carry, the owner as a
	// parameter, how many connections the lane has had (a statement is
	// prepared on the one its conn names) and how many statements it has
	// named.
	pipe                          pipeline
	batch                         batch        // queueWork's, for one table at a time
	ckd                           []ckptRow    // commit's scratch
	states                        []tableState // commit's scratch
	fence, markWrote, checkpoints stmt
	owner                         []byte
	connections, named            uint64
}

func newApplier(s *Sink, n int, conn *pgx.Conn) applier {
	return applier{s: s, n: n, conn: conn,
		fence: stmt{sql: fenceSQL}, markWrote: stmt{sql: markWroteSQL}, checkpoints: stmt{sql: checkpointSQL},
		owner: []byte(s.opts.Owner), connections: 1}
}

// failure is what a failed commit's (or warm-up's) error means, told once
// by classify for every path that sends (a commit of many tables, a
// table's own retry, a warm-up).
type failure uint8

const (
	failNone failure = iota
	// failClosing: the sink is closing (its context cancelled the send):
	// nothing more is done.
	failClosing
	// failSuperseded: the fence refused (a later sink of the owner
	// started): the sink writes nothing more.
	failSuperseded
	// failLost: the connection's fault, not the data's: the target is
	// down or the connection broke. The work is kept, the lane connects
	// again and retries.
	failLost
	// failTable: the data's fault: a commit of many tables is retried
	// table by table, and a table's own fails it (policy.failed).
	failTable
)

// classify tells what err, a send's error, means (closing: the sink's
// context is cancelled). The connection is lost on an error the server
// did not send, or one of its connection and shutdown classes (08, 57P),
// but not 08P01 (protocol violation): the server says that of a Bind
// whose parameters do not match the statement, which sent again would
// fail again (if the server also closed the connection, the next use
// fails without a server error, and that is lost).
func classify(closing bool, err error) failure {
	switch {
	case err == nil:
		return failNone
	case closing:
		return failClosing
	case isSuperseded(err) || errors.Is(err, ErrNotPermitted):
		return failSuperseded
	case errors.Is(err, ErrSchemaChange) || errors.Is(err, errBadData):
		return failTable // the data's, found before the server saw it
	}
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return failLost
	}
	if strings.HasPrefix(pe.Code, "08") && pe.Code != "08P01" || strings.HasPrefix(pe.Code, "57P") {
		return failLost
	}
	return failTable
}

// loseTarget is the one way a lane handles a lost connection (a commit's,
// a table's alone, a warm-up's): down, counted, the sink's outage
// reported once for all its lanes (Sink.link), connected again.
func (a *applier) loseTarget(err error) {
	a.down.Store(true)
	a.s.met.reconnects.Inc()
	a.s.link.Down(err, zap.Int("lane", a.n))
	a.reconnect()
}

// reconnect replaces the lane's connection, retrying with a doubling
// delay (50ms to 2s, shortened by up to 20% at random: the lanes that lost
// the target together do not all try again together) until it succeeds or
// the sink closes.
func (a *applier) reconnect() {
	pause := backoff.Backoff{Base: 50 * time.Millisecond, Max: 2 * time.Second, Jitter: 0.2}
	for a.s.ctx.Err() == nil {
		_ = a.conn.Close(context.Background())
		conn, err := a.s.connect(a.s.ctx)
		if err == nil {
			a.conn = conn
			a.connections++ // what was prepared on the old one is not on this one
			a.down.Store(false)
			a.s.link.Up()
			return
		}
		a.s.link.Down(err, zap.Int("lane", a.n))
		t := a.s.opts.Clock.NewTimer(pause.Next())
		select {
		case <-a.s.ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
	}
}

// connected reports whether the lane's connection was working when it
// was last used (a pgx connection may not be asked from another
// goroutine).
func (a *applier) connected() bool { return !a.down.Load() }

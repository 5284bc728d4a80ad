package pglink

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/zap"
)

// Condition is what an error says about the server.
type Condition int

const (
	// Failing: any other failure (a query refused, a protocol error).
	Failing Condition = iota
	// Unreachable: no server answers (refused, timed out, reset).
	Unreachable
	// ShuttingDown: the server is shutting down (57P03, 57P01 at
	// shutdown).
	ShuttingDown
	// StartingUp: the server is starting or recovering from a crash and
	// accepts no connections yet (57P03).
	StartingUp
	// InRecovery: a standby, or a server in recovery, that cannot do what
	// was asked (logical decoding and writes need a primary).
	InRecovery
	// Terminated: an administrator or another process ended the session
	// (57P01 pg_terminate_backend, 57P02 crash of another backend).
	Terminated
)

func (c Condition) String() string {
	switch c {
	case Unreachable:
		return "unreachable"
	case ShuttingDown:
		return "shutting down"
	case StartingUp:
		return "starting up"
	case InRecovery:
		return "in recovery"
	case Terminated:
		return "terminated"
	default:
		return "failing"
	}
}

// phrase is the condition as it reads after the link's name.
func (c Condition) phrase() string {
	switch c {
	case Terminated:
		return "ended the session"
	case Failing:
		return "is failing"
	default:
		return "is " + c.String()
	}
}

// Classify reads what err says about the server.
func Classify(err error) Condition {
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		msg := strings.ToLower(pg.Message)
		switch pg.Code {
		case "57P03": // cannot_connect_now
			switch {
			case strings.Contains(msg, "shutting down"):
				return ShuttingDown
			case strings.Contains(msg, "recovery"), strings.Contains(msg, "standby"):
				return InRecovery
			default:
				return StartingUp
			}
		case "57P01": // admin_shutdown: a fast shutdown or pg_terminate_backend
			if strings.Contains(msg, "administrator command") {
				return Terminated
			}
			return ShuttingDown
		case "57P02": // crash_shutdown
			return Terminated
		case "25006": // read_only_sql_transaction: a standby
			return InRecovery
		case "55000":
			if strings.Contains(msg, "recovery") {
				return InRecovery
			}
		}
		return Failing
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) || pgconn.Timeout(err) || isNetErr(err) {
		return Unreachable
	}
	return Failing
}

func isNetErr(err error) bool {
	s := err.Error()
	for _, w := range []string{"connection refused", "connection reset", "broken pipe", "no route to host", "i/o timeout", "EOF", "unexpected EOF", "closed"} {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}

// Cause is err's cause as an operator reads it: the server's message with
// its SQLSTATE when it sent one; for a connection that failed, the last
// attempt's error (pgx tries TLS first under sslmode=prefer, and a server
// without TLS makes that attempt say "tls error: server refused TLS
// connection", which is never the cause).
func Cause(err error) string {
	if err == nil {
		return ""
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		return fmt.Sprintf("%s: %s (SQLSTATE %s)", pg.Severity, pg.Message, pg.Code)
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		attempts := flatten(errors.Unwrap(ce))
		for i := len(attempts) - 1; i >= 0; i-- {
			if s := attempts[i].Error(); !strings.Contains(s, "server refused TLS connection") {
				return s
			}
		}
	}
	return err.Error()
}

// flatten lists the errors a join holds (itself when it is no join).
func flatten(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	return []error{err}
}

// Watch logs the outages of one link (a source, a target): Down at the
// first failure of an outage, and again only when its condition changes;
// Up once when it is back, with how long it was down. Safe for concurrent
// use: the lanes of a sink share one.
type Watch struct {
	log  *zap.Logger
	what string
	now  func() time.Time

	mu    sync.Mutex
	down  bool
	cond  Condition
	since time.Time
	fails int
}

// NewWatch returns a Watch logging to log as what ("the source", "the
// target"); now is its clock.
func NewWatch(log *zap.Logger, what string, now func() time.Time) *Watch {
	return &Watch{log: log, what: what, now: now}
}

// Down reports a failure of the link; it logs (at Warn) only the first of
// an outage and a change of condition, the rest at Debug. It returns the
// error's condition.
func (w *Watch) Down(err error, fields ...zap.Field) Condition {
	c := Classify(err)
	w.mu.Lock()
	first := !w.down
	changed := w.down && c != w.cond
	if first {
		w.down, w.since, w.fails = true, w.now(), 0
	}
	w.cond = c
	w.fails++
	w.mu.Unlock()
	fields = append(fields, zap.String("condition", c.String()), zap.String("cause", Cause(err)))
	switch {
	case first:
		w.log.Warn(w.what+" "+c.phrase()+": retrying until it is back", fields...)
	case changed:
		w.log.Warn(w.what+" "+c.phrase()+" now", fields...)
	default:
		w.log.Debug(w.what+" "+c.phrase()+" still", fields...)
	}
	return c
}

// Up reports that the link works; it logs the end of an outage once.
func (w *Watch) Up() {
	w.mu.Lock()
	if !w.down {
		w.mu.Unlock()
		return
	}
	w.down = false
	d, fails := w.now().Sub(w.since), w.fails
	w.mu.Unlock()
	w.log.Info(w.what+" is back", zap.Duration("down_for", d.Round(time.Millisecond)), zap.Int("failures", fails))
}

// IsDown reports whether the link is in an outage, and its condition.
func (w *Watch) IsDown() (bool, Condition) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.down, w.cond
}

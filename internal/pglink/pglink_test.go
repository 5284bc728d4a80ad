package pglink

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A connection refused under sslmode=prefer fails twice (TLS, then
// plain); the cause is the last attempt, never the TLS refusal.
func TestTheCauseOfAFailedConnectIsItsLastAttemptWithoutTheTLSNoise(t *testing.T) {
	_, err := pgx.Connect(context.Background(), "postgres://x@127.0.0.1:1/db?sslmode=prefer&connect_timeout=2")
	require.Error(t, err)
	require.Equal(t, Unreachable, Classify(err))
	require.Contains(t, Cause(err), "connection refused")
	require.NotContains(t, Cause(err), "\n")

	tls := errors.New("127.0.0.1:5432 (127.0.0.1): tls error: server refused TLS connection")
	last := &pgconn.PgError{Severity: "FATAL", Code: "57P03", Message: "the database system is shutting down"}
	joined := fmt.Errorf("wrapped: %w", errors.Join(tls, last))
	require.Equal(t, "FATAL: the database system is shutting down (SQLSTATE 57P03)", Cause(joined))
	require.Equal(t, ShuttingDown, Classify(joined))
}

func TestClassifyNamesTheServersState(t *testing.T) {
	for _, c := range []struct {
		code, msg string
		want      Condition
	}{
		{"57P03", "the database system is shutting down", ShuttingDown},
		{"57P03", "the database system is starting up", StartingUp},
		{"57P03", "the database system is not yet accepting connections", StartingUp},
		{"57P03", "the database system is in recovery mode", InRecovery},
		{"57P01", "terminating connection due to administrator command", Terminated},
		{"57P01", "terminating walsender process due to replication shutdown", ShuttingDown},
		{"57P02", "terminating connection because of crash of another server process", Terminated},
		{"25006", "cannot execute INSERT in a read-only transaction", InRecovery},
		{"42P01", "relation does not exist", Failing},
	} {
		err := fmt.Errorf("x: %w", &pgconn.PgError{Code: c.code, Message: c.msg})
		require.Equal(t, c.want, Classify(err), "%s %s", c.code, c.msg)
	}
	require.Equal(t, Failing, Classify(errors.New("something else")))
}

// An outage is logged once when it begins, once when its condition
// changes and once when it ends, however many failures are reported.
func TestAWatchLogsAnOutageOnce(t *testing.T) {
	core, logs := observer.New(zap.DebugLevel)
	now := time.Unix(100, 0)
	w := NewWatch(zap.New(core), "the target", func() time.Time { return now })
	w.Up() // not down: nothing
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}
	down := &pgconn.PgError{Code: "57P03", Message: "the database system is shutting down"}
	for i := 0; i < 5; i++ {
		w.Down(down)
	}
	w.Down(refused)
	w.Down(refused)
	now = now.Add(3 * time.Second)
	w.Up()
	w.Up()
	var warns, infos []string
	for _, e := range logs.All() {
		switch e.Level {
		case zap.WarnLevel:
			warns = append(warns, e.Message)
		case zap.InfoLevel:
			infos = append(infos, e.Message)
		}
	}
	require.Equal(t, []string{"the target is shutting down: retrying until it is back", "the target is unreachable now"}, warns)
	require.Equal(t, []string{"the target is back"}, infos)
	require.Equal(t, 3*time.Second, logs.FilterMessage("the target is back").All()[0].ContextMap()["down_for"])
	isDown, _ := w.IsDown()
	require.False(t, isDown)
}

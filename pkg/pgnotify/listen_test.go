package pgnotify

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/faultproxy"
	"github.com/cdcflow/eventservice/internal/pgtest"
)

// killBackends terminates the server connections whose application_name
// is app, as a crashed network or a restarted pooler would.
func killBackends(t *testing.T, dsn, app string) {
	t.Helper()
	ctx := context.Background()
	admin, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer admin.Close(ctx)
	var n int
	require.NoError(t, admin.QueryRow(ctx,
		"SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n))
	require.Positive(t, n, "a backend of %s to kill", app)
}

// TestListenReReadsAfterEveryReconnect: the listener's connection is
// killed; Listen reconnects, LISTENs again and calls OnConnect again (the
// re-read NOTIFY's non-durability requires) before handing out the
// notifications that follow.
func TestListenReReadsAfterEveryReconnect(t *testing.T) {
	srv := pgtest.Start(t)
	connected := make(chan int, 4)
	got := make(chan string, 16)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	connects := 0
	wg.Go(func() {
		_ = Listen(ctx, ListenOptions{DSN: srv.DSN + "&application_name=listener", Channels: []string{"state"},
			OnConnect: func(context.Context) error { connects++; connected <- connects; return nil },
			OnNotify:  func(_, payload string) { got <- payload }})
	})
	t.Cleanup(func() { cancel(); wg.Wait() })
	require.Equal(t, 1, <-connected)

	p, err := New(Options{DSN: srv.DSN})
	require.NoError(t, err)
	require.NoError(t, p.Start())
	require.NoError(t, p.Publish("state", "a", "before"))
	require.Equal(t, "before", <-got)

	killBackends(t, srv.DSN, "listener")
	require.Equal(t, 2, <-connected, "reconnected and re-read")
	require.NoError(t, p.Publish("state", "a", "after"))
	require.Equal(t, "after", <-got)
	closeCtx, done := context.WithTimeout(context.Background(), time.Minute)
	defer done()
	require.NoError(t, p.Close(closeCtx, true))
}

// TestPublisherSurvivesAKilledConnection: the publisher's connection is
// killed between two rounds of publishes; the failed statement keeps its
// batch, the pump reconnects, and every key's newest payload still
// arrives.
func TestPublisherSurvivesAKilledConnection(t *testing.T) {
	srv := pgtest.Start(t)
	const keys = 500
	first, stopFirst := listen(t, srv.DSN, "state", "1", keys)
	l, stopListening := listen(t, srv.DSN, "state", "2", keys)
	p, err := New(Options{DSN: srv.DSN + "&application_name=publisher", MaxBatch: 50})
	require.NoError(t, err)
	require.NoError(t, p.Start())
	publishRound(t, p, keys, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	waitListener(ctx, t, first, "the first round") // out: the publisher holds an idle connection
	stopFirst()
	killBackends(t, srv.DSN, "publisher")
	publishRound(t, p, keys, 2)
	require.NoError(t, p.Close(ctx, true))
	waitListener(ctx, t, l, "every key's newest payload after the connection was killed")
	stopListening()
}

// TestPublisherLosesNothingWhenTheNetworkResets: the publisher talks to the
// server through a proxy that resets every connection right after a round
// of publishes (statements in flight or about to be): failed statements
// keep their batches, the pump reconnects, every key's newest payload
// arrives.
func TestPublisherLosesNothingWhenTheNetworkResets(t *testing.T) {
	srv := pgtest.Start(t)
	proxy := pgtest.StartProxy(t, srv.Addr, 0)
	const keys = 500
	first, stopFirst := listen(t, srv.DSN, "state", "1", keys)
	l, stopListening := listen(t, srv.DSN, "state", "2", keys)
	reg := prometheus.NewRegistry()
	p, err := New(Options{DSN: "postgres://postgres@" + proxy.Addr + "/postgres?sslmode=disable", MaxBatch: 50, Registerer: reg})
	require.NoError(t, err)
	require.NoError(t, p.Start())
	publishRound(t, p, keys, 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	waitListener(ctx, t, first, "the first round")
	stopFirst()
	publishRound(t, p, keys, 2)
	proxy.Reset()
	require.NoError(t, p.Close(ctx, true))
	waitListener(ctx, t, l, "every key's newest payload after the reset")
	stopListening()
	// The metrics tell the story: a first connection, then one per reset
	// that a statement met; a clean scrape.
	require.GreaterOrEqual(t, testutil.ToFloat64(p.connects), 1.0)
	if testutil.ToFloat64(p.statementErrors.WithLabelValues("connection")) > 0 {
		require.GreaterOrEqual(t, testutil.ToFloat64(p.connects), 2.0, "reconnected after a lost connection")
	}
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	require.Empty(t, problems)
}

// publishRound publishes version v ("key=v") of keys 0..keys-1.
func publishRound(t *testing.T, p *Publisher, keys, v int) {
	t.Helper()
	for k := range keys {
		require.NoError(t, p.Publish("state", fmt.Sprint(k), fmt.Sprintf("%d=%d", k, v)))
	}
}

// waitListener waits until l saw its final payload for every key, or ctx
// ends (a failure).
func waitListener(ctx context.Context, t *testing.T, l *listenForTest, what string) {
	t.Helper()
	select {
	case <-l.done:
	case <-ctx.Done():
		t.Fatalf("%s did not arrive", what)
	}
}

// TestPublisherResetMidStatement holds the publisher's statement on the
// wire (the proxy has it; the server has not seen it) and resets the
// connection at exactly that moment: the statement fails as a lost
// connection, its batch is kept, the pump reconnects, and every key's
// newest payload arrives. Without the hold, a reset may land between
// statements and test nothing.
func TestPublisherResetMidStatement(t *testing.T) {
	srv := pgtest.Start(t)
	proxy := pgtest.StartProxy(t, srv.Addr, 0)
	const keys = 200
	first, stopFirst := listen(t, srv.DSN, "state", "1", keys)
	l, stopListening := listen(t, srv.DSN, "state", "2", keys)
	p, err := New(Options{DSN: "postgres://postgres@" + proxy.Addr + "/postgres?sslmode=disable", MaxBatch: 50})
	require.NoError(t, err)
	require.NoError(t, p.Start())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	publishRound(t, p, keys, 1)
	waitListener(ctx, t, first, "the first round") // connected, nothing in flight
	stopFirst()

	caught := proxy.Hold(faultproxy.Upstream)
	publishRound(t, p, keys, 2)
	select {
	case <-caught:
	case <-ctx.Done():
		t.Fatal("no statement reached the proxy")
	}
	require.Equal(t, 0.0, testutil.ToFloat64(p.statementErrors.WithLabelValues("connection")))
	proxy.Reset()
	require.NoError(t, p.Close(ctx, true))
	waitListener(ctx, t, l, "every key's newest payload after a reset mid-statement")
	stopListening()
	require.Equal(t, 1.0, testutil.ToFloat64(p.statementErrors.WithLabelValues("connection")), "the held statement failed as a lost connection")
	require.Equal(t, 2.0, testutil.ToFloat64(p.connects), "reconnected once")
}

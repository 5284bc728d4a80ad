package pgsource

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/faultproxy"
	"github.com/cdcflow/eventservice/internal/pgtest"
	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

// TestASilentLinkIsNoticedAndTheStreamResumes: the link to the source goes
// silent without closing (a proxy that stops forwarding both ways: every
// write still succeeds, nothing arrives, as in a partition or with a stuck
// walsender). The stream asks for a reply half-way through its receive
// timeout, ends the session with ErrSourceSilent when none comes, and
// connects again once the link works: the rows written while it was silent
// arrive, none twice. Without the timeout the session waits on the silent
// link for good and receive_timeouts_total stays 0.
func TestASilentLinkIsNoticedAndTheStreamResumes(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t1 (id int PRIMARY KEY)")
	setWalSenderTimeout(t, e, "1s") // the receive timeout is at least twice it
	proxy := pgtest.StartProxy(t, e.pg.Addr, 0)
	src := e.source(func(o *testOptions) {
		o.DSN = strings.Replace(e.pg.DSN, e.pg.Addr, proxy.Addr, 1)
		o.ReceiveTimeout = 2 * time.Second
	})
	_, sinks := openAndSubscribe(t, e, src, "t1")
	sink := sinks["t1"]
	for i := 1; i <= 5; i++ {
		e.exec("INSERT INTO t1 VALUES ($1)", i) // the test's own connection: not through the proxy
	}
	sink.waitFor("five rows", func() bool { return len(sink.rows) >= 5 })
	require.Zero(t, testutilValue(src.met.silences))

	proxy.Hold(faultproxy.Upstream)
	caught := proxy.Hold(faultproxy.Downstream)
	for i := 6; i <= 10; i++ {
		e.exec("INSERT INTO t1 VALUES ($1)", i)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	select {
	case <-caught: // the walsender's next message went silent
	case <-ctx.Done():
		t.Fatal("nothing from the server reached the proxy")
	}
	testwait.Within(t, time.Minute, "the silent session ended by its receive timeout", func() bool { return testutilValue(src.met.silences) >= 1 })
	proxy.Reset() // the link works again (the silent connections are gone)
	sink.waitFor("ten rows", func() bool { return len(sink.rows) >= 10 })
	seen := map[string]bool{}
	for _, c := range sink.changes() {
		id := text(c, "id")
		require.False(t, seen[id], "row %s twice", id)
		seen[id] = true
	}
	require.Len(t, seen, 10)
	require.GreaterOrEqual(t, testutilValue(src.met.reconnects), 1.0)
}

// TestAnIdleServerAskedForAReplyKeepsTheSession: with no heartbeats and
// nothing written the server sends nothing of its own; the stream asks for
// a reply every half receive timeout, gets one each time, and the session
// lives on (no receive timeout, no reconnect).
func TestAnIdleServerAskedForAReplyKeepsTheSession(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE t1 (id int PRIMARY KEY)")
	setWalSenderTimeout(t, e, "1s")
	replies := make(chan struct{}, 16)
	src := e.source(func(o *testOptions) {
		o.HeartbeatInterval = time.Hour           // an idle database, and nothing to wake it
		o.ReceiveTimeout = 400 * time.Millisecond // 2s: twice wal_sender_timeout
		o.knobs.replyHeard = func() {
			select {
			case replies <- struct{}{}:
			default:
			}
		}
	})
	openAndSubscribe(t, e, src, "t1")
	deadline := time.After(time.Minute)
	for range 3 {
		select {
		case <-replies:
		case <-deadline:
			t.Fatal("the server did not answer the stream's requests for a reply")
		}
	}
	require.Zero(t, testutilValue(src.met.silences), "every silence was answered")
	require.Zero(t, testutilValue(src.met.reconnects))
}

// setWalSenderTimeout sets the server's wal_sender_timeout and waits until
// the server has read it.
func setWalSenderTimeout(t *testing.T, e *srcEnv, v string) {
	pgtest.Set(t, e.conn, "wal_sender_timeout", v)
}

// A session's receive timeout is at least twice the server's
// wal_sender_timeout, and doubles for each session in a row that ended
// silent, up to 16 times.
func TestTheReceiveTimeoutFollowsTheServerAndBacksOff(t *testing.T) {
	e := newSrcEnv(t)
	setWalSenderTimeout(t, e, "3s")
	src := e.source(func(o *testOptions) { o.ReceiveTimeout = 2 * time.Second })
	ctx := context.Background()
	conn, err := connect(ctx, e.pg.DSN)
	require.NoError(t, err)
	defer conn.Close(ctx)
	for streak, want := range []time.Duration{6, 12, 24, 48, 96, 96} {
		got, err := src.receiveTimeout(ctx, conn, streak)
		require.NoError(t, err)
		require.Equal(t, want*time.Second, got, "after %d silent sessions", streak)
	}
	src.opts.ReceiveTimeout = -1
	got, err := src.receiveTimeout(ctx, conn, 0)
	require.NoError(t, err)
	require.Zero(t, got, "off")
}

// TestReceiveTimeoutOption: the default is PostgreSQL's
// wal_receiver_timeout, negative turns it off, and one below 100ms (a
// reconnect storm, not a liveness check) is refused.
func TestReceiveTimeoutOption(t *testing.T) {
	require.Equal(t, DefaultReceiveTimeout, Options{}.EnsureDefaults().ReceiveTimeout)
	schema, err := schemastore.NewMemory(schemastore.MemoryOptions{InitialResolvedTs: 1})
	require.NoError(t, err)
	opts := Options{DSN: "postgres://x", Schema: schema, Positions: newMemPositions(), StatusInterval: time.Second}.EnsureDefaults()
	opts.ReceiveTimeout = -1
	require.NoError(t, opts.Validate())
	opts.ReceiveTimeout = 50 * time.Millisecond
	require.ErrorIs(t, opts.Validate(), ErrInvalidOptions)
	opts.ReceiveTimeout = 100 * time.Millisecond
	require.NoError(t, opts.Validate())
}

// TestAMessageThatArrivesSlowlyIsNotSilence: one change of a 4 MB value
// through a link that forwards 32 KiB per 40 ms takes several seconds to
// arrive, longer than the receive timeout (2 s); the bytes that keep
// coming are the server's word, so the session lives on and the row
// arrives. Counting only whole messages, the session was ended as silent
// and the next one read the same message again.
func TestAMessageThatArrivesSlowlyIsNotSilence(t *testing.T) {
	e := newSrcEnv(t)
	e.exec("CREATE TABLE big (id int PRIMARY KEY, body text)")
	e.exec("ALTER TABLE big ALTER COLUMN body SET STORAGE EXTERNAL") // not compressed: the message is the value's size
	setWalSenderTimeout(t, e, "1s")
	proxy := pgtest.StartProxy(t, e.pg.Addr, 0)
	src := e.source(func(o *testOptions) {
		o.DSN = strings.Replace(e.pg.DSN, e.pg.Addr, proxy.Addr, 1)
		o.ReceiveTimeout = 2 * time.Second
	})
	_, sinks := openAndSubscribe(t, e, src, "big")
	sink := sinks["big"]
	proxy.SetDelay(40 * time.Millisecond) // per chunk of at most 32 KiB: about 5 s for 4 MB
	e.exec("INSERT INTO big SELECT 1, string_agg(md5(g::text), '') FROM generate_series(1, 131072) g")
	sink.waitFor("the 4 MB row", func() bool { return len(sink.rows) >= 1 })
	require.Len(t, text(sink.changes()[0], "body"), 4<<20)
	require.Zero(t, testutilValue(src.met.silences), "a link that delivers, however slowly, is not silent")
}

package pgnotify

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/cdcflow/eventservice/internal/pgtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// listenForTest listens on channel, records the newest payload per key
// ("key=payload" notifications) and closes done once want keys have the
// payload final (or, with expect set, the payload expect names for them).
type listenForTest struct {
	final  string
	expect map[string]string
	want   int
	done   chan struct{}

	mu      sync.Mutex
	newest  map[string]string
	atFinal int
	count   int
}

func listen(t testing.TB, dsn, channel, final string, want int) (*listenForTest, context.CancelFunc) {
	return listenFor(t, dsn, channel, &listenForTest{final: final, want: want})
}

func listenFor(t testing.TB, dsn, channel string, l *listenForTest) (*listenForTest, context.CancelFunc) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize())
	require.NoError(t, err)
	l.done, l.newest = make(chan struct{}), map[string]string{}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				return
			}
			k, v, _ := strings.Cut(n.Payload, "=")
			l.mu.Lock()
			final := l.final
			if l.expect != nil {
				final = l.expect[k]
			}
			if v == final && l.newest[k] != final {
				if l.atFinal++; l.atFinal == l.want {
					close(l.done)
				}
			}
			l.newest[k] = v
			l.count++
			l.mu.Unlock()
		}
	})
	stop := func() {
		cancel()
		wg.Wait()
		_ = conn.Close(context.Background())
	}
	t.Cleanup(stop)
	return l, stop
}

// TestEveryKeysNewestPayloadArrives: 1,000 keys, five versions each, with a
// real server and a real listener; Close drains, and every key's newest
// payload has arrived, in far fewer notifications than publishes.
func TestEveryKeysNewestPayloadArrives(t *testing.T) {
	srv := pgtest.Start(t)
	// With several statements in flight (each on its own connection) a
	// key is still in one batch at a time, so its versions still commit,
	// and reach the listener, in order.
	for _, conns := range []int{1, 4} {
		t.Run(fmt.Sprintf("connections=%d", conns), func(t *testing.T) { testNewestArrives(t, srv.DSN, conns) })
	}
}

func testNewestArrives(t *testing.T, dsn string, conns int) {
	const keys, versions = 1000, 5
	l, stopListening := listen(t, dsn, "state", fmt.Sprint(versions), keys)
	p, err := New(Options{DSN: dsn, Connections: conns, MaxBatch: 100})
	require.NoError(t, err)
	require.NoError(t, p.Start())
	for v := 1; v <= versions; v++ {
		for k := range keys {
			require.NoError(t, p.Publish("state", fmt.Sprint(k), fmt.Sprintf("%d=%d", k, v)))
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, p.Close(ctx, true))
	// NOTIFY is delivered at commit, in order: every key's last version
	// reaches the listener.
	waitListener(ctx, t, l, "every key's newest payload")
	stopListening()
	for k := range keys {
		require.Equal(t, fmt.Sprint(versions), l.newest[fmt.Sprint(k)], "key %d ends at its newest payload", k)
	}
	require.LessOrEqual(t, l.count, keys*versions)
	require.Zero(t, p.Pending())
	require.LessOrEqual(t, testutil.ToFloat64(p.connects), float64(conns), "a connection per statement in flight, no more")
}

// TestBadInputIsATypedError: a payload PostgreSQL would refuse and a bad
// channel fail at Publish, with sentinels, and nothing is queued.
func TestBadInputIsATypedError(t *testing.T) {
	p, err := New(Options{DSN: "postgres://postgres@127.0.0.1:1/postgres"})
	require.NoError(t, err)
	require.ErrorIs(t, p.Publish("c", "k", strings.Repeat("x", MaxPayloadBytes+1)), ErrPayloadTooLarge)
	require.NoError(t, p.Publish("c", "k", strings.Repeat("x", MaxPayloadBytes)))
	require.ErrorIs(t, p.Publish("", "k", "v"), ErrInvalidChannel)
	require.ErrorIs(t, p.Publish(strings.Repeat("c", 64), "k", "v"), ErrInvalidChannel)
	require.Equal(t, 1, p.Pending())
	require.NoError(t, p.Close(context.Background(), false))
	require.ErrorIs(t, p.Publish("c", "k", "v"), ErrClosed)

	_, err = New(Options{})
	require.ErrorIs(t, err, ErrInvalidOptions)
	_, err = New(Options{DSN: "postgres://x", MaxBatch: -1})
	require.True(t, errors.Is(err, ErrInvalidOptions))
	for _, conns := range []int{-1, MaxConnections + 1} {
		_, err = New(Options{DSN: "postgres://x", Connections: conns})
		require.ErrorIs(t, err, ErrInvalidOptions, "Connections %d", conns)
	}
}

// TestNULAndInvalidUTF8AreTypedErrors: PostgreSQL refuses a NUL byte or
// invalid UTF-8 in a channel or a payload (SQLSTATE 22021) for the whole
// statement, that is for every notification of the batch; Publish refuses
// them first, with sentinels, and queues nothing. Listen refuses such
// channels before it connects. Valid UTF-8, however unusual, passes.
func TestNULAndInvalidUTF8AreTypedErrors(t *testing.T) {
	p, err := New(Options{DSN: "postgres://postgres@127.0.0.1:1/postgres"})
	require.NoError(t, err)
	bad := []string{
		"\x00", "a\x00b", // NUL
		"a\xffb", "\xc3", // a byte that starts nothing; a sequence cut short
		"\xed\xa0\x80",     // a UTF-16 surrogate
		"\xf4\x90\x80\x80", // above U+10FFFF
		"\xc0\xaf",         // overlong
	}
	for _, b := range bad {
		require.ErrorIs(t, p.Publish("c", "k", "x"+b), ErrInvalidPayload, "payload %q", b)
		require.ErrorIs(t, p.Publish("c"+b, "k", "v"), ErrInvalidChannel, "channel %q", b)
	}
	require.Zero(t, p.Pending(), "nothing refused is queued")
	good := []string{"é", "€", "日本", "\uFFFD", "\uFFFF", "\U0010FFFF"}
	for i, g := range good {
		require.NoError(t, p.Publish("c"+g, fmt.Sprint(i), g))
	}
	require.Equal(t, len(good), p.Pending())
	require.NoError(t, p.Close(context.Background(), false))

	// A cancelled context: a Listen that got past validation would try to
	// connect and return ctx.Err() instead.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for _, b := range bad {
		err := Listen(ctx, ListenOptions{DSN: "postgres://postgres@127.0.0.1:1/postgres", Channels: []string{"c" + b},
			OnNotify: func(string, string) {}})
		require.ErrorIs(t, err, ErrInvalidChannel, "Listen channel %q", b)
	}
}

// TestPublishNeverWaitsForTheDatabase: with the server unreachable,
// Publish keeps returning and coalescing; the pending keys are kept while
// the pump fails to connect and retries.
func TestPublishNeverWaitsForTheDatabase(t *testing.T) {
	p, err := New(Options{DSN: "postgres://postgres@127.0.0.1:1/postgres?connect_timeout=1"})
	require.NoError(t, err)
	require.NoError(t, p.Start())
	for i := range 100_000 { // a Publish that waited for the database would hang here
		require.NoError(t, p.Publish("c", fmt.Sprint(i%100), "v"))
	}
	require.Equal(t, 100, p.Pending(), "coalesced per key, kept while the database is unreachable")
	require.NoError(t, p.Close(context.Background(), false))
}

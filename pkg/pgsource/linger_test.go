package pgsource

import (
	"bytes"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/backoff"
	"github.com/cdcflow/eventservice/pkg/schemastore"
)

// scriptedConn is a net.Conn double (the edge under test is the linger
// around a socket) whose reads return the next chunk of a script, as a
// socket returns what its receive queue holds.
type scriptedConn struct {
	net.Conn
	chunks [][]byte
}

func (c *scriptedConn) Read(p []byte) (int, error) {
	n := copy(p, c.chunks[0])
	if c.chunks[0] = c.chunks[0][n:]; len(c.chunks[0]) == 0 {
		c.chunks = c.chunks[1:]
	}
	return n, nil
}

// fakeTime drives a lingerConn's real-time hooks.
type fakeTime struct {
	at    time.Duration
	slept []time.Duration
}

func (f *fakeTime) attach(c *lingerConn) {
	c.now = func() time.Duration { return f.at }
	c.sleep = func(d time.Duration) { f.slept = append(f.slept, d); f.at += d }
}

// TestLingerWaitsOnlyAfterAReadThatDrainedTheQueue: once streaming, a read
// that follows a short one waits what is left of the linger since it; a read
// that follows a full one (the stream is behind) does not wait, nor does one
// whose linger has already passed, nor any before the stream starts. The
// bytes pass through unchanged.
func TestLingerWaitsOnlyAfterAReadThatDrainedTheQueue(t *testing.T) {
	script := [][]byte{
		[]byte("startup"),             // before stream(): short, no linger after it
		[]byte("reply"),               // short, still before stream()
		[]byte("msg1"),                // short: the next read lingers
		bytes.Repeat([]byte("x"), 16), // fills the buffer: the next read does not wait
		[]byte("msg2"),                // short: the next read lingers, but it has passed
		[]byte("msg3"),
	}
	var want []byte
	for _, c := range script {
		want = append(want, c...)
	}
	c := newLingerConn(&scriptedConn{chunks: script}, 5*time.Millisecond)
	ft := &fakeTime{}
	ft.attach(c)

	var got []byte
	read := func() {
		p := make([]byte, 16)
		n, err := c.Read(p)
		require.NoError(t, err)
		got = append(got, p[:n]...)
	}
	read()
	read()
	require.Empty(t, ft.slept, "no read lingers before the stream starts")
	c.stream()
	read() // msg1, short
	ft.at += 2 * time.Millisecond
	read() // the full read: waits the 3 ms left of the linger first
	require.Equal(t, []time.Duration{3 * time.Millisecond}, ft.slept)
	read() // msg2: after a full read, no wait
	require.Len(t, ft.slept, 1, "a read after a full one does not wait")
	ft.at += 7 * time.Millisecond
	read() // msg3: the linger since msg2 has passed
	require.Len(t, ft.slept, 1, "a read whose linger has passed does not wait")
	require.Equal(t, want, got)
}

// TestLingerIsBoundedByTheStreamsRate: a linger lets at most lingerBytes
// arrive at the rate the stream came since the last linger began, so a fast
// stream (a walsender draining a backlog) waits a few milliseconds, never
// long enough to fill the socket's buffers; a slow one waits the whole
// linger.
func TestLingerIsBoundedByTheStreamsRate(t *testing.T) {
	const linger, mib = 20 * time.Millisecond, 1 << 20
	c := newLingerConn(&scriptedConn{chunks: [][]byte{
		make([]byte, 10), make([]byte, mib), make([]byte, mib), make([]byte, 10), make([]byte, 1000), make([]byte, 10),
	}}, linger)
	ft := &fakeTime{}
	ft.attach(c)
	c.stream()
	read := func(size, want int) {
		t.Helper()
		n, err := c.Read(make([]byte, size))
		require.NoError(t, err)
		require.Equal(t, want, n)
	}
	read(64<<10, 10) // t=0: short
	read(mib, mib)   // the first linger, in full (no rate known); t=20ms; full
	read(mib, mib)   // full
	require.Equal(t, []time.Duration{linger}, ft.slept)
	ft.at += 12 * time.Millisecond
	read(64<<10, 10) // t=32ms: short, after 2 MiB since the linger began at 0
	read(64<<10, 1000)
	// At 2 MiB per 32 ms, lingerBytes (128 KiB) take 2 ms: the linger is
	// cut to that.
	require.Len(t, ft.slept, 2)
	require.InDelta(t, float64(2*time.Millisecond), float64(ft.slept[1]), float64(time.Microsecond))
	ft.at += 3 * time.Millisecond
	read(64<<10, 10) // after 1000 bytes in 5 ms: the whole linger, less the 3 ms since the short read
	require.Equal(t, 17*time.Millisecond, ft.slept[2])
}

// TestReadLingerOption: the default lingers, a negative value turns it off
// (a lingerConn that never lingers), and more than a second is refused.
func TestReadLingerOption(t *testing.T) {
	require.Equal(t, DefaultReadLinger, Options{}.EnsureDefaults().ReadLinger)
	schema, err := schemastore.NewMemory(schemastore.MemoryOptions{InitialResolvedTs: 1})
	require.NoError(t, err)
	opts := Options{DSN: "postgres://x", Schema: schema, Positions: newMemPositions()}.EnsureDefaults()
	opts.ReadLinger = -1
	require.NoError(t, opts.Validate())
	opts.ReadLinger = 2 * time.Second
	require.ErrorIs(t, opts.Validate(), ErrInvalidOptions)
}

// The stream's reconnect back-off doubles while sessions keep failing
// and starts over after a session that lasted, so a walsender terminated
// after a long healthy stream is retried at once.
func TestTheReconnectBackoffStartsOverAfterAHealthySession(t *testing.T) {
	b := backoff.Backoff{Base: 100 * time.Millisecond, Max: 5 * time.Second}
	var got []time.Duration
	for _, lasted := range []time.Duration{0, time.Second, 0, 0, 0, 0, 0, healthySession, 0} {
		got = append(got, reconnectDelay(&b, lasted))
	}
	ms := time.Millisecond
	require.Equal(t, []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms, 3200 * ms, 5000 * ms, 100 * ms, 200 * ms}, got)
}

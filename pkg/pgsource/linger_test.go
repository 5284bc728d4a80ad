package pgsource

import (
	"bytes"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/clock"
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
	var elapsed time.Duration
	var slept []time.Duration
	c.start = func() clock.Stopwatch { return clock.Stopwatch{} }
	c.since = func(clock.Stopwatch) time.Duration { return elapsed }
	c.sleep = func(d time.Duration) { slept = append(slept, d) }

	var got []byte
	read := func() {
		p := make([]byte, 16)
		n, err := c.Read(p)
		require.NoError(t, err)
		got = append(got, p[:n]...)
	}
	read()
	read()
	require.Empty(t, slept, "no read lingers before the stream starts")
	c.stream()
	read() // msg1, short
	elapsed = 2 * time.Millisecond
	read() // the full read: waits the 3 ms left of the linger first
	require.Equal(t, []time.Duration{3 * time.Millisecond}, slept)
	read() // msg2: after a full read, no wait
	require.Len(t, slept, 1, "a read after a full one does not wait")
	elapsed = 7 * time.Millisecond
	read() // msg3: the linger since msg2 has passed
	require.Len(t, slept, 1, "a read whose linger has passed does not wait")
	require.Equal(t, want, got)
}

// TestReadLingerOption: the default lingers, a negative value turns it off
// (no lingerConn), and more than a second is refused.
func TestReadLingerOption(t *testing.T) {
	require.Equal(t, DefaultReadLinger, Options{}.withDefaults().ReadLinger)
	schema, err := schemastore.NewMemory(schemastore.MemoryOptions{InitialResolvedTs: 1})
	require.NoError(t, err)
	opts := Options{DSN: "postgres://x", Schema: schema, Positions: newMemPositions()}.withDefaults()
	opts.ReadLinger = -1
	require.NoError(t, opts.validate())
	opts.ReadLinger = 2 * time.Second
	require.ErrorIs(t, opts.validate(), ErrInvalidOptions)
}

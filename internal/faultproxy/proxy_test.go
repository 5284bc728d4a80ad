package faultproxy

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echoForTest echoes each line back; the test's cleanup stops it.
func echoForTest(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	t.Cleanup(func() { _ = ln.Close(); <-done })
	return ln.Addr().String()
}

func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, msg string) (string, error) {
	t.Helper()
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return "", err
	}
	require.NoError(t, c.SetReadDeadline(time.Now().Add(30*time.Second)))
	return r.ReadString('\n')
}

// Forwarding, a downstream hold that catches the reply until released, a
// reset that breaks the connection, and a partition that refuses new
// connections until healed.
func TestProxyFaults(t *testing.T) {
	p := Start(t, echoForTest(t))
	p.SetDelay(time.Millisecond)
	c, err := net.Dial("tcp", p.Addr)
	require.NoError(t, err)
	defer c.Close()
	r := bufio.NewReader(c)
	got, err := roundTrip(t, c, r, "one")
	require.NoError(t, err)
	require.Equal(t, "one\n", got)

	caught := p.Hold(Downstream)
	_, err = c.Write([]byte("two\n"))
	require.NoError(t, err)
	<-caught // the echo is on the wire, held
	require.NoError(t, c.SetReadDeadline(time.Now().Add(50*time.Millisecond)))
	_, err = r.ReadString('\n')
	require.ErrorIs(t, err, timeoutErr(err), "nothing arrives while held")
	p.Release()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(30*time.Second)))
	got, err = r.ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "two\n", got)

	p.Reset()
	_, err = roundTrip(t, c, r, "three")
	require.Error(t, err, "a reset connection is gone")

	p.Partition()
	c2, err := net.Dial("tcp", p.Addr)
	if err == nil {
		_, err = roundTrip(t, c2, bufio.NewReader(c2), "four")
		_ = c2.Close()
	}
	require.Error(t, err, "no connection through a partition")
	p.Heal()
	c3, err := net.Dial("tcp", p.Addr)
	require.NoError(t, err)
	defer c3.Close()
	got, err = roundTrip(t, c3, bufio.NewReader(c3), "five")
	require.NoError(t, err)
	require.Equal(t, "five\n", got)
}

// timeoutErr returns err if it is a timeout, so that ErrorIs passes only
// for one.
func timeoutErr(err error) error {
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return err
	}
	return io.ErrUnexpectedEOF
}

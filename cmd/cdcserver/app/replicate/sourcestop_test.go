package replicate

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/testwait"
)

// shutdownBound is how long a shutdown of the source may take with serve
// connected: a native subscriber's takes about a second, and one that
// serve holds up lasts until serve stops.
const shutdownBound = 30 * time.Second

// reconnect replaces the pair's source connection (after a restart of
// the source, or before a smart shutdown, which waits for it).
func (p *pair) reconnect(open bool) {
	p.t.Helper()
	p.conn.Close(context.Background())
	if !open {
		return
	}
	conn := p.connectSource()
	p.t.Cleanup(func() { conn.Close(context.Background()) })
	p.conn = conn
}

// connectSource connects to the source, again for a while: just after a
// restart an attempt can meet a server still settling (a connection it
// closes at once).
func (p *pair) connectSource() *pgx.Conn {
	p.t.Helper()
	var conn *pgx.Conn
	var err error
	if !testwait.Until(30*time.Second, func() bool {
		conn, err = pgx.Connect(context.Background(), p.src.DSN)
		return err == nil
	}) {
		p.t.Fatalf("connect to the source: %v", err)
	}
	return conn
}

// A shutdown of the source is never held up by serve, and serve resumes
// by itself once the source is back:
//   - smart, and then fast, while serve idles: a smart shutdown waits for every regular
//     client to leave, and serve's connections that stay open (its
//     stream, heartbeat, poll, catalog) are walsenders, which it does not
//     wait for;
//   - fast, under a write load with a transaction left open: the
//     walsender waits until its client confirms everything it sent, and
//     after the last commit come the aborted transactions and the
//     shutdown checkpoint; serve confirms the server's WAL end once every
//     commit decoded is durable, as a native subscriber does.
//
// Each completes within shutdownBound (pg_ctl -t); held up, it lasted
// until serve stopped.
func TestASourceShutdownIsNotHeldUp(t *testing.T) {
	p := newPair(t)
	p.exec("CREATE TABLE t (id int PRIMARY KEY, v int)")
	p.exec("INSERT INTO t SELECT g, 0 FROM generate_series(1, 200) g")
	stop, stderr := p.serve(p.config())
	defer func() { _ = stop() }() // stop is idempotent: the end of the test calls it too
	p.waitEqual("the snapshot")

	p.reconnect(false) // the test's own client would hold a smart shutdown
	began := time.Now()
	require.NoError(t, p.src.StopWith("smart", shutdownBound), "a smart shutdown with serve idle\n%s", stderr)
	t.Logf("smart shutdown, serve idle: %v", time.Since(began).Round(time.Millisecond))
	require.NoError(t, p.src.Restart())
	p.reconnect(true)
	p.exec("UPDATE t SET v = 1 WHERE id = 1")
	p.waitEqual("after a smart shutdown")

	p.reconnect(false)
	began = time.Now()
	require.NoError(t, p.src.StopWith("fast", shutdownBound), "a fast shutdown with serve idle\n%s", stderr)
	t.Logf("fast shutdown, serve idle: %v", time.Since(began).Round(time.Millisecond))
	require.NoError(t, p.src.Restart())
	p.reconnect(true)
	p.exec("UPDATE t SET v = 3 WHERE id = 3")
	p.waitEqual("after a fast shutdown")

	// Under load: writers commit until the server ends their sessions,
	// and one transaction is left open (its WAL lies after every commit).
	open := p.connectSource()
	defer open.Close(context.Background())
	_, err := open.Exec(context.Background(), "BEGIN; INSERT INTO t VALUES (1000000, 0)")
	require.NoError(t, err)
	var commits atomic.Int64
	var wg sync.WaitGroup
	writers := make([]*pgx.Conn, 2)
	for w := range writers {
		writers[w] = p.connectSource()
	}
	for w, conn := range writers {
		wg.Go(func() {
			defer conn.Close(context.Background())
			for i := 0; ; i++ {
				id := 1 + (i*2+w)%200
				if _, err := conn.Exec(context.Background(), fmt.Sprintf(
					"BEGIN; UPDATE t SET v = v + 1 WHERE id = %d; INSERT INTO t VALUES (%d, %d); COMMIT", id, 1000+i*2+w, i)); err != nil {
					return // the shutdown ended the session
				}
				commits.Add(1)
			}
		})
	}
	testwait.For(t, "the writers committing 200 transactions", func() bool { return commits.Load() >= 200 })
	p.reconnect(false)
	began = time.Now()
	require.NoError(t, p.src.StopWith("fast", shutdownBound), "a fast shutdown under load\n%s", stderr)
	t.Logf("fast shutdown, under load: %v", time.Since(began).Round(time.Millisecond))
	wg.Wait()
	require.NoError(t, p.src.Restart())
	p.reconnect(true)
	p.exec("UPDATE t SET v = 2 WHERE id = 2")
	p.waitEqual("after a fast shutdown under load")
	require.NoError(t, stop())
}

package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// probeTable holds the probe rows (id, clock_timestamp()) that measure
// lag; both changefeeds replicate it like any other table.
const probeTable = "pgbench_probe"

// rowsPerTxn: every load transaction writes this many rows.
const rowsPerTxn = 4

func tableName(i int) string { return fmt.Sprintf("t%04d", i+1) }

// connect opens a connection whose statement cache holds every table's
// statements (3 per table at 1000 tables).
func connect(ctx context.Context, dsn string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.StatementCacheCapacity = 4096
	return pgx.ConnectConfig(ctx, cfg)
}

// connectLean opens a connection that keeps no prepared statements (each
// query is parsed and planned where it runs): the prober's and the
// pollers'. A backend holding a plan per table pays for every relcache
// invalidation (each autoanalyze of a table) with a walk over its plans,
// and an idle one is woken to do it: 8 such backends took a third of the
// machine's CPU during a drain at 1000 tables (perf), whichever
// changefeed was draining.
func connectLean(ctx context.Context, dsn string) (*pgx.Conn, error) {
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	return pgx.ConnectConfig(ctx, cfg)
}

// createSchema creates the tables t0001..tN (id bigint key, n int, v text)
// and the probe table.
func createSchema(ctx context.Context, dsn string, tables int) error {
	conn, err := connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var b strings.Builder
	fmt.Fprintf(&b, "CREATE TABLE %s (id bigint PRIMARY KEY, ts timestamptz NOT NULL);", probeTable)
	for i := range tables {
		fmt.Fprintf(&b, "CREATE TABLE %s (id bigint PRIMARY KEY, n int NOT NULL, v text NOT NULL);", tableName(i))
		if (i+1)%100 == 0 || i == tables-1 {
			if _, err := conn.Exec(ctx, b.String()); err != nil {
				return err
			}
			b.Reset()
		}
	}
	if b.Len() > 0 {
		_, err = conn.Exec(ctx, b.String())
	}
	return err
}

// key is one live row a client inserted.
type key struct {
	table int32
	id    int64
}

// client is one load connection with its own random stream and its own
// rows: it updates and deletes only rows it inserted, so clients never
// wait on each other's row locks.
type client struct {
	conn *pgx.Conn
	rng  *rand.Rand
	next int64
	live []key
}

// loader is the load driver: clients connections, each committing
// rowsPerTxn-row transactions (75% inserts into a random table, 20%
// updates and 5% deletes of a random live row) as fast as it can.
type loader struct {
	tables        int
	ins, upd, del []string
	clients       []*client
	// committed counts the transactions committed so far, for the
	// main load's time series.
	committed atomic.Int64
}

func newLoader(ctx context.Context, dsn string, tables, clients int, seed uint64) (*loader, error) {
	l := &loader{tables: tables}
	for i := range tables {
		t := tableName(i)
		l.ins = append(l.ins, "INSERT INTO "+t+" (id, n, v) VALUES ($1, 0, $2)")
		l.upd = append(l.upd, "UPDATE "+t+" SET n = n + 1, v = $2 WHERE id = $1")
		l.del = append(l.del, "DELETE FROM "+t+" WHERE id = $1")
	}
	for i := range clients {
		conn, err := connect(ctx, dsn)
		if err != nil {
			l.close()
			return nil, err
		}
		l.clients = append(l.clients, &client{conn: conn, rng: rand.New(rand.NewPCG(seed, uint64(i))), next: int64(i+1) << 40})
	}
	return l, nil
}

func (l *loader) close() {
	for _, c := range l.clients {
		_ = c.conn.Close(context.Background())
	}
}

// loadStats is what one load phase committed and how long it took.
type loadStats struct {
	rows    int
	elapsed time.Duration
}

func (s loadStats) rowsPerSec() float64 { return float64(s.rows) / s.elapsed.Seconds() }

// run commits rows rows (rounded up to whole transactions) over every
// client, flat out, and returns when the last one committed.
func (l *loader) run(ctx context.Context, rows int) (loadStats, error) {
	txns := int64((rows + rowsPerTxn - 1) / rowsPerTxn)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var claimed atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	start := time.Now()
	for _, c := range l.clients {
		wg.Go(func() {
			for claimed.Add(1) <= txns {
				if err := c.txn(ctx, l); err != nil {
					once.Do(func() { first = err; cancel() })
					return
				}
				l.committed.Add(1)
			}
		})
	}
	wg.Wait()
	return loadStats{rows: int(txns) * rowsPerTxn, elapsed: time.Since(start)}, first
}

// txn commits one transaction: its statements go out as one pipelined
// batch, which PostgreSQL runs as one implicit transaction.
func (c *client) txn(ctx context.Context, l *loader) error {
	b := &pgx.Batch{}
	for range rowsPerTxn {
		p := c.rng.IntN(100)
		switch {
		case p < 75 || len(c.live) == 0:
			t := int32(c.rng.IntN(l.tables))
			c.next++
			b.Queue(l.ins[t], c.next, c.payload())
			c.live = append(c.live, key{t, c.next})
		case p < 95:
			k := c.live[c.rng.IntN(len(c.live))]
			b.Queue(l.upd[k.table], k.id, c.payload())
		default:
			i := c.rng.IntN(len(c.live))
			k := c.live[i]
			c.live[i] = c.live[len(c.live)-1]
			c.live = c.live[:len(c.live)-1]
			b.Queue(l.del[k.table], k.id)
		}
	}
	return c.conn.SendBatch(ctx, b).Close()
}

func (c *client) payload() string { return fmt.Sprintf("%016x%016x", c.rng.Uint64(), c.rng.Uint64()) }

// prober writes probe rows on a connection of its own.
type prober struct {
	conn *pgx.Conn
	next int64
}

// write commits the next probe row and returns its id.
func (p *prober) write(ctx context.Context) (int64, error) {
	p.next++
	_, err := p.conn.Exec(ctx, "INSERT INTO "+probeTable+" (id, ts) VALUES ($1, clock_timestamp())", p.next)
	return p.next, err
}

// every writes a probe row every period until the returned stop is
// called; stop returns the first error. stop waits for a write in flight
// rather than cancel it: pgx closes a connection whose query's context
// ends mid-flight, and the fence that follows uses the same connection
// (a run failed with "write the fence: conn closed").
func (p *prober) every(ctx context.Context, period time.Duration) (stop func() error) {
	stopped := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		tick := time.NewTicker(period)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				done <- nil
				return
			case <-stopped:
				done <- nil
				return
			case <-tick.C:
			}
			if _, err := p.write(ctx); err != nil && ctx.Err() == nil {
				done <- err
				return
			}
		}
	}()
	return func() error {
		close(stopped)
		return <-done
	}
}

// fence commits one transaction holding a row with id fenceID in every
// table and the next probe row; once the target holds all of them, it
// holds everything committed before (each changefeed keeps every table's
// commit order). It returns the probe's id and the commit time.
func (p *prober) fence(ctx context.Context, l *loader, fenceID int64) (int64, time.Time, error) {
	b := &pgx.Batch{}
	for i := range l.tables {
		b.Queue(l.ins[i], fenceID, "fence")
	}
	p.next++
	b.Queue("INSERT INTO "+probeTable+" (id, ts) VALUES ($1, clock_timestamp())", p.next)
	err := p.conn.SendBatch(ctx, b).Close()
	return p.next, time.Now(), err
}

// waitFence polls the target until it holds fenceID in every table (none
// when tables is 0) and probe row probeID, every 50 ms, with a deadline;
// check (the changefeed's health) is called on each poll. A poll asks for
// the probe, then for the missing tables in chunks of fenceChunk, and
// stops at the first chunk that still misses one: a poll while the
// changefeed is behind costs the target a few queries, not one per table
// (which, every 50 ms at 1000 tables, competed with the drain it timed).
// It returns when the poll that found the last row returned.
func waitFence(ctx context.Context, dsn string, tables int, fenceID, probeID int64, timeout time.Duration, check func() error) (time.Time, error) {
	conn, err := connectLean(ctx, dsn)
	if err != nil {
		return time.Time{}, err
	}
	defer conn.Close(context.Background())
	missing := make([]int, tables)
	for i := range missing {
		missing[i] = i
	}
	probeSeen := false
	deadline := time.Now().Add(timeout)
	var lastErr error
	for {
		var err error
		if !probeSeen {
			err = conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+probeTable+" WHERE id = $1)", probeID).Scan(&probeSeen)
		}
		for err == nil && probeSeen && len(missing) > 0 {
			chunk := missing[:min(fenceChunk, len(missing))]
			b := &pgx.Batch{}
			for _, t := range chunk {
				b.Queue("SELECT EXISTS (SELECT 1 FROM "+tableName(t)+" WHERE id = $1)", fenceID)
			}
			var still []int
			if still, err = readExists(conn.SendBatch(ctx, b), chunk); err != nil {
				break
			}
			missing = append(still, missing[len(chunk):]...)
			if len(still) > 0 {
				break
			}
		}
		now := time.Now()
		if err != nil {
			lastErr = err // a table not created yet, say
		}
		if err == nil && len(missing) == 0 && probeSeen {
			return now, nil
		}
		if check != nil {
			if err := check(); err != nil {
				return now, err
			}
		}
		if now.After(deadline) {
			return now, fmt.Errorf("timed out after %v: %d tables without the fence row, probe %d seen: %v (last error: %v)",
				timeout, len(missing), probeID, probeSeen, lastErr)
		}
		select {
		case <-ctx.Done():
			return now, ctx.Err()
		case <-time.After(50 * time.Millisecond): // polling another process's progress
		}
	}
}

// fenceChunk is how many tables a fence poll asks about in one round trip.
const fenceChunk = 16

// readExists reads a fence poll's batch: the tables of chunk still
// missing the fence row.
func readExists(br pgx.BatchResults, chunk []int) ([]int, error) {
	var still []int
	var err error
	for _, t := range chunk {
		var ok bool
		if err = br.QueryRow().Scan(&ok); err != nil {
			break
		}
		if !ok {
			still = append(still, t)
		}
	}
	return still, errors.Join(err, br.Close())
}

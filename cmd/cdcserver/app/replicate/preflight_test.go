package replicate

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/pgtest"
	"github.com/cdcflow/eventservice/pkg/pgsink"
	"github.com/cdcflow/eventservice/pkg/pgsource"
)

// catalogOf is what a start could change in the database at dsn: its
// schemas and relations outside the system's, its publications, the
// cluster's slots and the rows of every table of the tool's schema.
func catalogOf(t *testing.T, dsn string) string {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var out strings.Builder
	for _, q := range []string{
		`SELECT n.nspname || '.' || coalesce(c.relname, '') || ':' || coalesce(c.relkind::text, '') FROM pg_namespace n
		   LEFT JOIN pg_class c ON c.relnamespace = n.oid
		 WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') AND n.nspname NOT LIKE 'pg_temp%' AND n.nspname NOT LIKE 'pg_toast_temp%'
		 ORDER BY 1`,
		`SELECT pubname || ':' || puballtables FROM pg_publication ORDER BY 1`,
		`SELECT slot_name || ':' || coalesce(database, '') || ':' || coalesce(confirmed_flush_lsn::text, '') FROM pg_replication_slots ORDER BY 1`,
		`SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'cdcflow' ORDER BY 1`,
	} {
		rows, err := conn.Query(ctx, q)
		require.NoError(t, err, q)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err, q)
		fmt.Fprintf(&out, "%s\n", strings.Join(lines, "\n"))
	}
	rows, err := conn.Query(ctx, "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'cdcflow' AND c.relkind = 'r' ORDER BY 1")
	require.NoError(t, err)
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	for _, tb := range tables {
		var v string
		require.NoError(t, conn.QueryRow(ctx, fmt.Sprintf("SELECT coalesce(string_agg(x::text, ';' ORDER BY x::text), '') FROM cdcflow.%s x", tb)).Scan(&v))
		fmt.Fprintf(&out, "cdcflow.%s: %s\n", tb, v)
	}
	return out.String()
}

// Every bad start of a changefeed fails (exit 2, ErrSetup) before it
// creates, drops or writes anything: the catalogs of both databases (and
// the tool's state in them) are the same after as before.
func TestABadStartLeavesBothDatabasesAsTheyWere(t *testing.T) {
	p := newPair(t)
	p.exec("CREATE TABLE t (id int PRIMARY KEY, v text)")
	p.exec("INSERT INTO t VALUES (1, 'a')")
	p.exec("CREATE ROLE norepl LOGIN")
	p.exec("CREATE ROLE repl LOGIN REPLICATION")
	p.exec("GRANT SELECT ON t TO norepl, repl")
	plain := pgtest.Start(t) // wal_level replica
	target, err := pgx.Connect(context.Background(), p.dst.DSN)
	require.NoError(t, err)
	defer target.Close(context.Background())
	_, err = target.Exec(context.Background(), "CREATE ROLE ro LOGIN SUPERUSER; ALTER ROLE ro SET default_transaction_read_only = on")
	require.NoError(t, err)
	as := func(dsn, role string) string {
		return strings.Replace(dsn, "postgres://postgres@", "postgres://"+role+"@", 1)
	}
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()

	for _, c := range []struct {
		name string
		cfg  func(*Config)
		want error
		msg  string
	}{
		{"the metrics port taken", func(c *Config) { c.MetricsAddr = taken.Addr().String() }, ErrSetup, "address already in use"},
		{"the sink is the source", func(c *Config) { c.Sink = c.Source }, ErrSameDatabase, "both reach"},
		{"a source without wal_level logical", func(c *Config) { c.Source = plain.DSN }, pgsource.ErrNotLogical, "wal_level"},
		{"a source role without REPLICATION", func(c *Config) { c.Source = as(c.Source, "norepl") }, pgsource.ErrPrivilege, "REPLICATION"},
		{"a source role that may not create the publication", func(c *Config) { c.Source = as(c.Source, "repl") }, pgsource.ErrPrivilege, "publication"},
		{"a read-only target", func(c *Config) { c.Sink = as(c.Sink, "ro") }, ErrTargetUnwritable, "read-only"},
		{"a target that is no server", func(c *Config) { c.Sink = "postgres://x@127.0.0.1:1/x?connect_timeout=2" }, pgsink.ErrConnect, "connection refused"},
	} {
		t.Run(c.name, func(t *testing.T) {
			src, dst := catalogOf(t, p.src.DSN), catalogOf(t, p.dst.DSN)
			cfg := p.config()
			c.cfg(&cfg)
			err := p.runOnce(cfg)
			require.ErrorIs(t, err, ErrSetup)
			require.ErrorIs(t, err, c.want)
			require.ErrorContains(t, err, c.msg)
			require.Equal(t, src, catalogOf(t, p.src.DSN), "the source is as it was")
			require.Equal(t, dst, catalogOf(t, p.dst.DSN), "the target is as it was")
		})
	}

	// With the publication made by a superuser, a role that may replicate
	// still needs room for the registry.
	p.exec("CREATE PUBLICATION cdcflow FOR TABLE t")
	src, dst := catalogOf(t, p.src.DSN), catalogOf(t, p.dst.DSN)
	cfg := p.config()
	cfg.Source = as(cfg.Source, "repl")
	err = p.runOnce(cfg)
	require.ErrorIs(t, err, pgsource.ErrPrivilege)
	require.ErrorContains(t, err, "registry")
	require.Equal(t, src, catalogOf(t, p.src.DSN))
	require.Equal(t, dst, catalogOf(t, p.dst.DSN))
	p.exec("DROP PUBLICATION cdcflow")

	// No free replication slot: refused before anything is made (pgtest's
	// logical servers have 20).
	var max int
	require.NoError(t, p.conn.QueryRow(context.Background(), "SELECT current_setting('max_replication_slots')::int").Scan(&max))
	for i := range max {
		p.exec(fmt.Sprintf("SELECT pg_create_physical_replication_slot('filler_%d')", i))
	}
	src, dst = catalogOf(t, p.src.DSN), catalogOf(t, p.dst.DSN)
	err = p.runOnce(p.config())
	require.ErrorIs(t, err, pgsource.ErrNoRoom)
	require.ErrorContains(t, err, "max_replication_slots")
	require.Equal(t, src, catalogOf(t, p.src.DSN))
	require.Equal(t, dst, catalogOf(t, p.dst.DSN))
	for i := range max {
		p.exec(fmt.Sprintf("SELECT pg_drop_replication_slot('filler_%d')", i))
	}

	// A slot made by hand (or by another tool) under the changefeed's name
	// is left alone: neither taken over nor dropped.
	p.exec("SELECT pg_create_logical_replication_slot('cdcflow', 'pgoutput')")
	src, dst = catalogOf(t, p.src.DSN), catalogOf(t, p.dst.DSN)
	err = p.runOnce(p.config())
	require.ErrorIs(t, err, pgsource.ErrNotOwner)
	require.Equal(t, src, catalogOf(t, p.src.DSN), "the slot is still there, untouched")
	require.Equal(t, dst, catalogOf(t, p.dst.DSN))
	p.exec("SELECT pg_drop_replication_slot('cdcflow')")

	// A changefeed of another slot holds the target: refused there, and
	// it is not refused in turn.
	cfg = p.config()
	cfg.Slot = "other"
	stop, _ := p.serve(cfg)
	p.waitEqual("the first changefeed")
	require.NoError(t, stop())
	src, dst = catalogOf(t, p.src.DSN), catalogOf(t, p.dst.DSN)
	err = p.runOnce(p.config())
	require.ErrorIs(t, err, pgsink.ErrAnotherOwner)
	require.ErrorContains(t, err, `"other"`)
	require.Equal(t, src, catalogOf(t, p.src.DSN))
	require.Equal(t, dst, catalogOf(t, p.dst.DSN))
}

// A second serve that forgot --slot, pointed at another target, finds the
// first changefeed's slot registered for the first target: it is refused
// (exit 2) naming that target, the slot is never absent (polled while it
// starts), and the first changefeed runs on.
func TestAServeForAnotherTargetLeavesTheSlotOfTheFirst(t *testing.T) {
	p := newPair(t)
	p.exec("CREATE TABLE t (id int PRIMARY KEY, v text)")
	p.exec("INSERT INTO t SELECT g, 'v' FROM generate_series(1, 100) g")
	stop, stderr := p.serve(p.config())
	defer func() { _ = stop() }()
	p.waitEqual("the first changefeed")

	second := pgtest.Start(t)
	before := catalogOf(t, second.DSN)
	var absent, polls atomic.Int64
	quit, done := make(chan struct{}), make(chan struct{})
	watcher, err := pgx.Connect(context.Background(), p.src.DSN)
	require.NoError(t, err)
	defer watcher.Close(context.Background())
	go func() {
		defer close(done)
		for {
			var n int
			if err := watcher.QueryRow(context.Background(), "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'cdcflow'").Scan(&n); err != nil {
				t.Errorf("watcher: %v", err)
				return
			}
			polls.Add(1)
			if n == 0 {
				absent.Add(1)
			}
			select {
			case <-quit:
				return
			default:
			}
		}
	}()
	cfg := p.config()
	cfg.Sink = second.DSN
	err = p.runOnce(cfg)
	close(quit)
	<-done
	require.ErrorIs(t, err, ErrSetup)
	require.ErrorIs(t, err, pgsource.ErrNotOwner)
	require.ErrorContains(t, err, p.dst.Addr, "it names the slot's owner")
	require.Positive(t, polls.Load())
	require.Equal(t, before, catalogOf(t, second.DSN), "nothing was created on the second target")
	require.Zero(t, absent.Load(), "the first changefeed's slot was never absent")

	p.exec("UPDATE t SET v = 'after' WHERE id = 1")
	p.waitEqual("the first changefeed after the refused start")
	require.NotContains(t, stderr.String(), "ERROR", "the first changefeed never noticed")
}

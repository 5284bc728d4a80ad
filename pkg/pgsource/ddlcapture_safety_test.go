package pgsource

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/testwait"
)

// The DDL capture acts on a user's database, so: a role that is not a
// superuser (or NoDDLCapture) installs nothing; installed, a DDL of
// another role, not a superuser, succeeds and is captured (the trigger is
// SECURITY DEFINER, with a fixed search_path); and Open installs it once,
// whatever number of starts.
func TestTheDDLCaptureIsTheSuperusersAndNeverFailsADDL(t *testing.T) {
	e := newSrcEnv(t)
	ctx := context.Background()
	e.exec("CREATE ROLE app LOGIN")
	e.exec("CREATE ROLE repl LOGIN REPLICATION")
	e.exec("GRANT CREATE ON DATABASE postgres TO repl")
	e.exec("GRANT CREATE ON SCHEMA public TO app")
	triggers := func() int {
		var n int
		require.NoError(t, e.conn.QueryRow(ctx, "SELECT count(*) FROM pg_event_trigger WHERE evtname LIKE 'cdcflow_%'").Scan(&n))
		return n
	}

	asRepl := e.source(func(o *testOptions) { o.DSN = strings.Replace(e.pg.DSN, "postgres://postgres@", "postgres://repl@", 1) })
	info, err := asRepl.Open(ctx)
	require.NoError(t, err)
	require.False(t, info.DDLCapture)
	require.Zero(t, triggers(), "not a superuser: nothing installed")
	asRepl.Close()
	opted := e.source(func(o *testOptions) { o.NoDDLCapture = true; o.Slot = "opted" })
	info, err = opted.Open(ctx)
	require.NoError(t, err)
	require.False(t, info.DDLCapture)
	require.Zero(t, triggers(), "NoDDLCapture: nothing installed")
	opted.Close()

	for _, slot := range []string{"first", "second"} {
		s := e.source(func(o *testOptions) { o.Slot = slot })
		info, err := s.Open(ctx)
		require.NoError(t, err)
		require.True(t, info.DDLCapture)
		s.Close()
	}
	require.Equal(t, 2, triggers(), "one pair, whatever number of starts")

	app, err := pgx.Connect(ctx, strings.Replace(e.pg.DSN, "postgres://postgres@", "postgres://app@", 1))
	require.NoError(t, err)
	defer app.Close(ctx)
	for _, q := range []string{"CREATE TABLE mine (id int PRIMARY KEY, a text)", "ALTER TABLE mine RENAME COLUMN a TO b", "DROP TABLE mine"} {
		_, err := app.Exec(ctx, q)
		require.NoError(t, err, "%s by a role that is not a superuser", q)
	}
	var captured int
	require.NoError(t, e.conn.QueryRow(ctx, `SELECT count(*) FROM pg_logical_slot_peek_binary_changes('first', NULL, NULL,
		'proto_version', '1', 'publication_names', 'cdcflow', 'messages', 'true') WHERE position('cdcflow-ddl' IN encode(data, 'escape')) > 0`).Scan(&captured))
	require.Equal(t, 3, captured, "each of the role's DDLs captured, in the stream")
}

// The changefeeds of one source starting at once each install the
// capture; the installs wait for each other (the registry's advisory
// lock) rather than fail on each other's CREATE OR REPLACE FUNCTION. The
// test holds that lock, starts two installs, sees both wait for it, lets
// go, and both succeed.
func TestInstallsOfTheDDLCaptureAtOnceWaitForEachOther(t *testing.T) {
	e := newSrcEnv(t)
	ctx := context.Background()
	_, err := e.conn.Exec(ctx, "SELECT pg_advisory_lock(1667523430, 1)")
	require.NoError(t, err)
	errs := make(chan error, 2)
	for range 2 {
		conn, err := pgx.Connect(ctx, e.pg.DSN)
		require.NoError(t, err)
		defer conn.Close(ctx)
		go func() { _, err := conn.Exec(ctx, captureSQL); errs <- err }()
	}
	testwait.Within(t, time.Minute, "both installs waiting for the lock", func() bool {
		var waiting int
		return e.conn.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 1667523430 AND objid = 1
AND NOT granted`).Scan(&waiting) == nil && waiting == 2
	})
	_, err = e.conn.Exec(ctx, "SELECT pg_advisory_unlock(1667523430, 1)")
	require.NoError(t, err)
	for range 2 {
		require.NoError(t, <-errs)
	}
	var n int
	require.NoError(t, e.conn.QueryRow(ctx, "SELECT count(*) FROM pg_event_trigger WHERE evtname LIKE 'cdcflow_%'").Scan(&n))
	require.Equal(t, 2, n)
}

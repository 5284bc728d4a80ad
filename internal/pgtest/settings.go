package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cdcflow/eventservice/internal/testwait"
)

// Set sets the server setting name to value through conn (ALTER SYSTEM;
// "" resets it), reloads the configuration and waits until conn's backend
// shows the value: a backend reads a reload at its next command, and a
// connection opened at once may not run under it yet (a commit that did
// not wait for a synchronous standby just set), so what the test does
// after runs under the setting.
func Set(t testing.TB, conn *pgx.Conn, name, value string) {
	t.Helper()
	ctx := context.Background()
	stmt := "ALTER SYSTEM SET " + name + " = '" + value + "'"
	if value == "" {
		stmt = "ALTER SYSTEM RESET " + name
	}
	for _, q := range []string{stmt, "SELECT pg_reload_conf()"} {
		if _, err := conn.Exec(ctx, q); err != nil {
			t.Fatalf("pgtest: %s: %v", q, err)
		}
	}
	var v string
	if !testwait.Until(time.Minute, func() bool {
		if err := conn.QueryRow(ctx, "SHOW "+name).Scan(&v); err != nil {
			t.Fatalf("pgtest: SHOW %s: %v", name, err)
		}
		return v == value
	}) {
		t.Fatalf("pgtest: the server never read %s = %q (it shows %q)", name, value, v)
	}
}

package node

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// A password from a node's environment reaches the connection as itself,
// whatever it holds (quotes, backslashes, spaces, URL metacharacters),
// in a URL DSN and in a key=value one, the DSN otherwise read as before;
// or the DSN is refused (ErrBadSpec), never changed in meaning. The DSN
// with it is found to hold a password, so that none is stored in etcd.
func FuzzWithPassword(f *testing.F) {
	for _, s := range []struct{ dsn, pw string }{
		{"postgres://repl@127.0.0.1:5432/app", "s3cret"},
		{"host=127.0.0.1 port=5432 user=repl dbname=app", `it's a \ back'slash`},
		{"postgres://repl@127.0.0.1/app?sslmode=disable", "p@ss:w/rd?#%"},
		{"host=h user=u dbname=d", " spaced "},
	} {
		f.Add(s.dsn, s.pw)
	}
	f.Fuzz(func(t *testing.T, dsn, pw string) {
		if pw == "" || strings.ContainsRune(pw, 0) || (ChangefeedConfig{Source: dsn, Sink: dsn}).Check() != nil {
			return // no password to give, or a DSN the API refuses
		}
		base, err := pgconn.ParseConfig(dsn)
		if err != nil || base.Password != "" {
			return // not a DSN, or one whose password comes from elsewhere (a passfile, PGPASSWORD)
		}
		out, err := withPassword(dsn, "CDCFLOW_PASSWORD_PW", func(string) string { return pw })
		if err != nil {
			require.ErrorIs(t, err, ErrBadSpec) // a DSN of an odd shape: refused, never changed
			return
		}
		require.True(t, hasPassword(out), "the DSN with its password: %q", out)
		require.NotEqual(t, dsn, out)
		cfg, err := pgconn.ParseConfig(out)
		require.NoError(t, err, "%q", out)
		require.Equal(t, pw, cfg.Password)
		require.Equal(t, base.Host, cfg.Host)
		require.Equal(t, base.User, cfg.User)
		require.Equal(t, base.Database, cfg.Database)
	})
}

// Ordinary DSNs take a password from the environment (not refused).
func TestOrdinaryDSNsTakeAPassword(t *testing.T) {
	for _, dsn := range []string{"postgres://repl@127.0.0.1:5432/app", "postgresql://127.0.0.1/app?sslmode=disable",
		"host=127.0.0.1 port=5432 user=repl dbname=app", "host=h user=u dbname="} {
		out, err := withPassword(dsn, "CDCFLOW_PASSWORD_PW", func(string) string { return `it's a \ p@ss:w/rd?#%` })
		require.NoError(t, err, dsn)
		cfg, err := pgconn.ParseConfig(out)
		require.NoError(t, err)
		require.Equal(t, `it's a \ p@ss:w/rd?#%`, cfg.Password, dsn)
	}
}

// A specification reads a password only from a variable named
// CDCFLOW_PASSWORD_ and more: whoever writes specifications cannot have a
// node send another of its variables (the API's token, a cloud key) to a
// server of theirs as a password. Refused at the API (Check) and at the
// node (a specification written to etcd by other means).
func TestASpecificationReadsOnlyPasswordVariables(t *testing.T) {
	getenv := func(string) string { return "secret" }
	for _, env := range []string{"AWS_SECRET_ACCESS_KEY", "CDCFLOW_API_TOKEN", "CDCFLOW_PASSWORD_", "cdcflow_password_x", "PGPASSWORD"} {
		c := ChangefeedConfig{Source: "host=h user=u dbname=d", Sink: "host=h2 user=u dbname=d", SourcePasswordEnv: env}
		require.ErrorIs(t, c.Check(), ErrBadSpec, env)
		c.SourcePasswordEnv, c.SinkPasswordEnv = "", env
		require.ErrorIs(t, c.Check(), ErrBadSpec, env)
		_, err := withPassword(c.Source, env, getenv)
		require.ErrorIs(t, err, ErrBadSpec, env)
	}
	c := ChangefeedConfig{Source: "host=h user=u dbname=d", Sink: "host=h2 user=u dbname=d", SourcePasswordEnv: "CDCFLOW_PASSWORD_SRC",
		SinkPasswordEnv: "CDCFLOW_PASSWORD_DST"}
	require.NoError(t, c.Check())
	out, err := withPassword(c.Source, c.SourcePasswordEnv, getenv)
	require.NoError(t, err)
	cfg, err := pgconn.ParseConfig(out)
	require.NoError(t, err)
	require.Equal(t, "secret", cfg.Password)
}

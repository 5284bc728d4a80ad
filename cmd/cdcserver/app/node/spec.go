package node

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cdcflow/eventservice/cmd/cdcserver/app/replicate"
)

// Errors of a changefeed's specification.
var (
	// ErrBadSpec is a changefeed configuration that cannot run.
	ErrBadSpec = errors.New("node: invalid changefeed configuration")
	// ErrClearPassword is a DSN with a password in it: a specification
	// lives in etcd, where a password must never be stored in clear.
	ErrClearPassword = errors.New("node: a password in a DSN would be stored in etcd in clear")
)

// PasswordEnvPrefix begins the name of every environment variable a
// specification may read a password from: whoever may write a
// specification must not have a node send another of its variables (the
// API's token, a cloud key) as a password to a server of their choosing.
const PasswordEnvPrefix = "CDCFLOW_PASSWORD_"

// ChangefeedConfig is a changefeed's specification as the API takes it
// and etcd keeps it: serve's options that apply to one changefeed. A
// password is never in it: a DSN names a password file on the nodes
// (passfile=/path, libpq's), or SourcePasswordEnv/SinkPasswordEnv name an
// environment variable of the nodes that holds it.
type ChangefeedConfig struct {
	Source string `json:"source"`
	Sink   string `json:"sink"`
	// Slot and Publication default to the changefeed's name (serve's
	// default, cdcflow, would be shared by every changefeed of a source).
	Slot        string `json:"slot,omitempty"`
	Publication string `json:"publication,omitempty"`
	// Include and Exclude are serve's --include and --exclude.
	Include []string `json:"include,omitempty"`
	Exclude []string `json:"exclude,omitempty"`
	// SinkWorkers is serve's --sink-workers (0: its default).
	SinkWorkers int `json:"sink_workers,omitempty"`
	// MaxRetainedWAL is serve's --max-retained-wal in bytes (0: its
	// default; -1: no bound).
	MaxRetainedWAL int64 `json:"max_retained_wal,omitempty"`
	// NoDDLCapture is serve's --no-ddl-capture.
	NoDDLCapture bool `json:"no_ddl_capture,omitempty"`
	// SourcePasswordEnv and SinkPasswordEnv name environment variables
	// of the nodes holding the databases' passwords ("": none), each named
	// PasswordEnvPrefix and more.
	SourcePasswordEnv string `json:"source_password_env,omitempty"`
	SinkPasswordEnv   string `json:"sink_password_env,omitempty"`
}

// Check validates c for changefeed name, as the API does before storing
// it: both DSNs set and without a password.
func (c ChangefeedConfig) Check() error {
	if c.Source == "" || c.Sink == "" {
		return fmt.Errorf("%w: source and sink are required", ErrBadSpec)
	}
	for _, env := range []string{c.SourcePasswordEnv, c.SinkPasswordEnv} {
		if err := checkPasswordEnv(env); err != nil {
			return err
		}
	}
	for _, d := range []struct{ what, dsn string }{{"source", c.Source}, {"sink", c.Sink}} {
		if urlForm(d.dsn) {
			if _, err := url.Parse(d.dsn); err != nil {
				return fmt.Errorf("%w: the %s DSN: %w", ErrBadSpec, d.what, err)
			}
			if auth, _, _ := strings.Cut(strings.SplitN(d.dsn, "://", 2)[1], "/"); strings.Count(auth, "@") > 1 {
				return fmt.Errorf("%w: the %s DSN has an @ in its user name (write it %%40)", ErrBadSpec, d.what)
			}
			if strings.Contains(d.dsn, "#") {
				// A fragment means nothing to a database and does not
				// survive a password's insertion as written.
				return fmt.Errorf("%w: the %s DSN has a fragment (#)", ErrBadSpec, d.what)
			}
		}
		if hasPassword(d.dsn) {
			return fmt.Errorf("%w: the %s DSN: use passfile=/path (a file on the nodes) or %s_password_env", ErrClearPassword, d.what, d.what)
		}
	}
	return nil
}

// checkPasswordEnv refuses a password variable not named
// PasswordEnvPrefix and more ("" is none, and passes).
func checkPasswordEnv(env string) error {
	if env != "" && (!strings.HasPrefix(env, PasswordEnvPrefix) || len(env) == len(PasswordEnvPrefix)) {
		return fmt.Errorf("%w: a password's environment variable must be named %s<something>, not %q", ErrBadSpec, PasswordEnvPrefix, env)
	}
	return nil
}

// urlForm reports whether dsn is a URL, as libpq and pgx tell: by its
// scheme (anything else is key=value pairs).
func urlForm(dsn string) bool {
	return strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://")
}

// hasPassword reports whether dsn (a URL or key=value pairs) holds a
// password (a URL that does not parse holds none it can be told of:
// Check refuses it).
func hasPassword(dsn string) bool {
	if urlForm(dsn) {
		u, err := url.Parse(dsn)
		if err != nil {
			return false
		}
		_, set := u.User.Password()
		return set || u.Query().Has("password")
	}
	for _, f := range strings.Fields(dsn) {
		if k, _, ok := strings.Cut(f, "="); ok && strings.TrimSpace(k) == "password" {
			return true
		}
	}
	return false
}

// withPassword is dsn with the password of environment variable env
// (dsn itself if env is ""), checked: the DSN with it must read as dsn
// does, with that password (ErrBadSpec if not: a DSN of an odd shape,
// which can take a passfile= instead).
func withPassword(dsn, env string, getenv func(string) string) (string, error) {
	out, err := insertPassword(dsn, env, getenv)
	if err != nil || env == "" {
		return out, err
	}
	base, err := pgconn.ParseConfig(dsn)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrBadSpec, err)
	}
	cfg, err := pgconn.ParseConfig(out)
	if err != nil || cfg.Password != getenv(env) || cfg.Host != base.Host || cfg.Port != base.Port || cfg.User != base.User ||
		cfg.Database != base.Database {
		return "", fmt.Errorf("%w: the password of %s cannot be added to this DSN as written: give it a passfile= instead", ErrBadSpec, env)
	}
	return out, nil
}

// insertPassword is withPassword's splice, unchecked.
func insertPassword(dsn, env string, getenv func(string) string) (string, error) {
	if env == "" {
		return dsn, nil
	}
	if err := checkPasswordEnv(env); err != nil { // a specification not written through the API
		return "", err
	}
	pw := getenv(env)
	if pw == "" {
		return "", fmt.Errorf("%w: environment variable %s is not set on this node", ErrBadSpec, env)
	}
	if urlForm(dsn) {
		// Spliced into the userinfo as written, the rest untouched (a
		// URL written out again can read otherwise: spaces, paths).
		if _, err := url.Parse(dsn); err != nil {
			return "", fmt.Errorf("%w: %w", ErrBadSpec, err)
		}
		start := strings.Index(dsn, "://") + 3
		end := len(dsn)
		if i := strings.IndexAny(dsn[start:], "/?"); i >= 0 {
			end = start + i
		}
		secret := url.UserPassword("", pw).String() // ":" and the password, escaped for a userinfo
		if at := strings.LastIndex(dsn[start:end], "@"); at >= 0 {
			return dsn[:start+at] + secret + dsn[start+at:], nil
		}
		return dsn[:start] + secret + "@" + dsn[start:], nil
	}
	// First: a trailing "key=" of the DSN would take what follows it as
	// its value (spaces around = are optional).
	return "password='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(pw) + "' " + dsn, nil
}

// serveConfig is the replicate.Config changefeed name runs with on this
// node: serve's defaults, the specification's options, its own data
// directory, and no HTTP of its own (the node's serves its metrics).
func serveConfig(name string, c ChangefeedConfig, dataDir, logLevel string) (replicate.Config, error) {
	cfg := replicate.DefaultConfig()
	var err error
	if cfg.Source, err = withPassword(c.Source, c.SourcePasswordEnv, os.Getenv); err != nil {
		return cfg, err
	}
	if cfg.Sink, err = withPassword(c.Sink, c.SinkPasswordEnv, os.Getenv); err != nil {
		return cfg, err
	}
	cfg.Slot, cfg.Publication = name, name
	if c.Slot != "" {
		cfg.Slot = c.Slot
	}
	if c.Publication != "" {
		cfg.Publication = c.Publication
	}
	cfg.Include, cfg.Exclude = c.Include, c.Exclude
	if c.SinkWorkers != 0 {
		cfg.SinkWorkers = c.SinkWorkers
	}
	switch {
	case c.MaxRetainedWAL < 0:
		cfg.MaxRetainedWAL = 0
	case c.MaxRetainedWAL > 0:
		cfg.MaxRetainedWAL = c.MaxRetainedWAL
	}
	cfg.NoDDLCapture = c.NoDDLCapture
	cfg.DataDir = filepath.Join(dataDir, "changefeeds", name)
	cfg.MetricsAddr, cfg.PprofAddr, cfg.ProgressInterval = "", "", 0
	cfg.LogLevel = logLevel
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("%w: %w", ErrBadSpec, err)
	}
	return cfg, nil
}

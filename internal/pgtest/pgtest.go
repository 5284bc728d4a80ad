package pgtest

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// binDirs are where Debian's PostgreSQL 15 packages put initdb and pg_ctl.
var binDirs = []string{"/usr/lib/postgresql/15/bin", "/usr/local/bin", "/usr/bin"}

// Server is one running PostgreSQL.
type Server struct {
	// Addr is 127.0.0.1:port.
	Addr string
	// DSN connects as the superuser "postgres" to database "postgres".
	DSN  string
	dir  string
	data string
	bin  string
	opts string
	run  func(name string, args ...string) *exec.Cmd
	// locpath is where compileLocales put the server's own locales ("" for none).
	locpath string
}

// Options shape a server. The zero value is the tests' default: fsync off,
// wal_level replica, 50 connections.
type Options struct {
	// Logical sets wal_level=logical with room for replication slots and
	// WAL senders, for logical replication sources.
	Logical bool
	// Fsync keeps fsync on (benchmarks that must pay for durability).
	Fsync bool
	// Settings are more "name=value" server settings.
	Settings []string
	// TLS turns ssl on with a self-signed certificate for 127.0.0.1 (the
	// DSN keeps sslmode=disable; sslmode=require in it negotiates TLS).
	TLS bool
	// Locales are locales the server can use besides C and POSIX
	// ("ja_JP.UTF-8"): compiled from glibc's sources (Debian's locales
	// package) into the server's directory with localedef, which the
	// server finds through LOCPATH. A machine has only the C locales.
	Locales []string
}

// Start initialises a cluster in a fresh directory and starts it; the
// test's cleanup stops it and removes the directory.
func Start(t testing.TB) *Server { return StartWith(t, Options{}) }

// StartWith is Start with opts.
func StartWith(t testing.TB, opts Options) *Server {
	t.Helper()
	s, err := Launch(opts)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("pgtest: %v", err)
		}
	})
	return s
}

// Launch starts a server outside a test (a benchmark program); Close
// stops it and removes its directory.
func Launch(opts Options) (*Server, error) {
	bin, err := findBin()
	if err != nil {
		return nil, fmt.Errorf("%w (install Debian's postgresql-15; .ci/run does)", err)
	}
	s := &Server{bin: bin}
	var uid, gid int
	if s.run, uid, gid, err = runner(); err != nil {
		return nil, err
	}
	if s.dir, err = os.MkdirTemp("", "pgtest-"); err != nil {
		return nil, err
	}
	fail := func(err error) (*Server, error) {
		_ = os.RemoveAll(s.dir)
		return nil, err
	}
	if uid >= 0 {
		if err := os.Chown(s.dir, uid, gid); err != nil {
			return fail(err)
		}
	}
	s.data = filepath.Join(s.dir, "data")
	if out, err := s.run(filepath.Join(bin, "initdb"), "-D", s.data, "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8").CombinedOutput(); err != nil {
		return fail(fmt.Errorf("initdb: %v\n%s", err, out))
	}
	settings := []string{"listen_addresses=127.0.0.1", "unix_socket_directories=" + s.dir, "max_connections=50"}
	if !opts.Fsync {
		settings = append(settings, "fsync=off")
	}
	if opts.Logical {
		settings = append(settings, "wal_level=logical", "max_replication_slots=20", "max_wal_senders=20")
	}
	if opts.TLS {
		cert, key, err := selfSigned(s.dir, uid, gid)
		if err != nil {
			return fail(err)
		}
		settings = append(settings, "ssl=on", "ssl_cert_file="+cert, "ssl_key_file="+key)
	}
	if len(opts.Locales) > 0 {
		if err := s.compileLocales(opts.Locales); err != nil {
			return fail(err)
		}
	}
	settings = append(settings, opts.Settings...)
	// The port is free when chosen but nothing holds it until the server
	// binds it, so another server started in parallel (another test
	// package's) can take it first: the start then fails on the bind and
	// is tried again on another port.
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return fail(err)
		}
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		s.DSN = fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", s.Addr)
		s.opts = fmt.Sprintf("-p %d", port)
		for _, kv := range settings {
			s.opts += " -c " + kv
		}
		err = s.Restart()
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, errPortTaken) || attempt == portAttempts {
			return fail(err)
		}
	}
}

// portAttempts bounds how many ports Launch tries when the one it chose
// is taken before the server binds it.
const portAttempts = 5

// errPortTaken marks a start that failed because the port was taken.
var errPortTaken = errors.New("port taken")

// Stop stops the server (fast shutdown), keeping its data: Restart starts
// it again on the same address.
func (s *Server) Stop() error {
	if out, err := s.run(filepath.Join(s.bin, "pg_ctl"), "-D", s.data, "-m", "fast", "-w", "stop").CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl stop: %v\n%s", err, out)
	}
	return nil
}

// StopWith stops the server in mode ("smart", "fast"), keeping its data,
// and fails if it has not stopped within wait (pg_ctl's -t): a shutdown
// that something holds up is an error, not a hang.
func (s *Server) StopWith(mode string, wait time.Duration) error {
	secs := strconv.Itoa(max(1, int(wait.Round(time.Second)/time.Second)))
	if out, err := s.run(filepath.Join(s.bin, "pg_ctl"), "-D", s.data, "-m", mode, "-t", secs, "-w", "stop").CombinedOutput(); err != nil {
		return fmt.Errorf("pg_ctl stop -m %s: %v\n%s", mode, err, out)
	}
	return nil
}

// Client runs one of the server's client programs (pgbench, psql) with
// args after its connection options (host, port, the superuser), and
// returns what it printed.
func (s *Server) Client(prog string, args ...string) ([]byte, error) {
	host, port, err := net.SplitHostPort(s.Addr)
	if err != nil {
		return nil, err
	}
	full := append([]string{"-h", host, "-p", port, "-U", "postgres"}, args...)
	return s.run(filepath.Join(s.bin, prog), full...).CombinedOutput()
}

// Restart starts a stopped server again.
func (s *Server) Restart() error {
	start := s.run(filepath.Join(s.bin, "pg_ctl"), "-D", s.data, "-o", s.opts, "-w", "-l", filepath.Join(s.dir, "log"), "start")
	if s.locpath != "" {
		if start.Env == nil {
			start.Env = os.Environ()
		}
		start.Env = append(start.Env, "LOCPATH="+s.locpath)
	}
	if out, err := start.CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(s.dir, "log"))
		// The log is appended to by every start: only this start's part
		// says why this one failed.
		_ = os.Remove(filepath.Join(s.dir, "log"))
		if bytes.Contains(log, []byte("Address already in use")) {
			err = fmt.Errorf("%w: %v", errPortTaken, err)
		}
		return fmt.Errorf("pg_ctl start: %w\n%s\n%s", err, out, log)
	}
	return nil
}

// Close stops the server at once (immediate shutdown) and removes its
// directory.
func (s *Server) Close() error {
	defer os.RemoveAll(s.dir)
	out, err := s.run(filepath.Join(s.bin, "pg_ctl"), "-D", s.data, "-m", "immediate", "-w", "stop").CombinedOutput()
	if err != nil && !strings.Contains(string(out), "Is server running?") {
		return fmt.Errorf("pg_ctl stop: %v\n%s", err, out)
	}
	return nil
}

// DSNFor connects to database db as the superuser.
func (s *Server) DSNFor(db string) string {
	return fmt.Sprintf("postgres://postgres@%s/%s?sslmode=disable", s.Addr, db)
}

// compileLocales compiles each of names (language_TERRITORY.charset) with
// localedef into the server's directory, for LOCPATH.
func (s *Server) compileLocales(names []string) error {
	s.locpath = filepath.Join(s.dir, "locale")
	if out, err := s.run("mkdir", s.locpath).CombinedOutput(); err != nil { // as the server's user
		return fmt.Errorf("mkdir %s: %v\n%s", s.locpath, err, out)
	}
	for _, name := range names {
		lang, charset, ok := strings.Cut(name, ".")
		if !ok {
			return fmt.Errorf("locale %q: want language_TERRITORY.charset", name)
		}
		// localedef exits 1 for warnings with the locale written; a
		// locale it did not write is the error.
		out, err := s.run("localedef", "-i", lang, "-f", charset, filepath.Join(s.locpath, name)).CombinedOutput()
		if _, statErr := os.Stat(filepath.Join(s.locpath, name, "LC_MONETARY")); statErr != nil {
			return fmt.Errorf("localedef %s (install Debian's locales; .ci/run does): %v\n%s", name, err, out)
		}
	}
	return nil
}

func findBin() (string, error) {
	for _, d := range binDirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", errors.New("no initdb in " + fmt.Sprint(binDirs))
}

// runner returns how to run the server's programs: directly when not
// root, as the "postgres" user otherwise (initdb and postgres refuse root),
// with that user's uid and gid (-1 when running directly).
func runner() (func(string, ...string) *exec.Cmd, int, int, error) {
	if os.Geteuid() != 0 {
		return exec.Command, -1, -1, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, 0, 0, fmt.Errorf("running as root needs the postgres user of the PostgreSQL packages: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return func(name string, args ...string) *exec.Cmd {
		c := exec.Command(name, args...)
		c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		c.Dir = "/"
		c.Env = append(os.Environ(), "HOME=/tmp", "USER=postgres")
		return c
	}, uid, gid, nil
}

// freePort chooses a free loopback port below the kernel's ephemeral
// range, so that no outgoing connection (the tests make many) is given it
// between the choice and the server's bind; it falls back to a port the
// kernel chooses when none of a few random ones is free.
func freePort() (int, error) {
	low := ephemeralLow()
	for range 20 {
		port := portFloor + rand.IntN(low-portFloor)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			_ = l.Close()
			return port, nil
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// portFloor is the lowest port freePort chooses: above the well-known
// and most registered services' ports.
const portFloor = 20000

// ephemeralLow is the first port of the kernel's ephemeral range (Linux's
// default, 32768, when it cannot be read or leaves no room below it).
func ephemeralLow() int {
	const linuxDefault = 32768
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return linuxDefault
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return linuxDefault
	}
	low, err := strconv.Atoi(f[0])
	if err != nil || low <= portFloor+1000 {
		return linuxDefault
	}
	return low
}

// PostmasterPID is the running server's postmaster process id, from its
// postmaster.pid (benchmarks read the server's CPU time from it).
func (s *Server) PostmasterPID() (int, error) {
	b, err := os.ReadFile(filepath.Join(s.data, "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(line))
}

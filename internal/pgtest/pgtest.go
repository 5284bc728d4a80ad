// Package pgtest starts a real PostgreSQL server for tests: initdb and
// postgres from the machine's PostgreSQL 15 packages, as a non-root user
// (the packages' "postgres" user when the test runs as root), on a free
// loopback port, in a temporary directory that is removed when the test
// ends. A test that cannot start the server fails; it never skips.
//
// StartProxy puts a loopback TCP proxy in front of a server that can delay
// traffic (a slow link) and reset every connection (a network fault).
//
// Invariants: every server Start creates is stopped (pg_ctl stop -m
// immediate) and its directory removed by the test's cleanup; nothing is
// shared between tests or left behind.
package pgtest

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
)

// binDirs are where Debian's PostgreSQL 15 packages put initdb and pg_ctl.
var binDirs = []string{"/usr/lib/postgresql/15/bin", "/usr/local/bin", "/usr/bin"}

// Server is one running PostgreSQL.
type Server struct {
	// Addr is 127.0.0.1:port.
	Addr string
	// DSN connects as the superuser "postgres" to database "postgres".
	DSN string
	dir string
	bin string
	run func(name string, args ...string) *exec.Cmd
}

// Start initialises a cluster in a fresh directory and starts it; the
// test's cleanup stops it and removes the directory.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := findBin()
	if err != nil {
		t.Fatalf("pgtest: %v (install Debian's postgresql-15; .ci/run does)", err)
	}
	s := &Server{bin: bin}
	var uid, gid int
	s.run, uid, gid, err = runner()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	s.dir = dir
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if uid >= 0 {
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatalf("pgtest: %v", err)
		}
	}
	port, err := freePort()
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	s.DSN = fmt.Sprintf("postgres://postgres@%s/postgres?sslmode=disable", s.Addr)
	data := filepath.Join(dir, "data")
	if out, err := s.run(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8").CombinedOutput(); err != nil {
		t.Fatalf("pgtest: initdb: %v\n%s", err, out)
	}
	opts := fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -c unix_socket_directories=%s -c fsync=off -c max_connections=50", port, dir)
	if out, err := s.run(filepath.Join(bin, "pg_ctl"), "-D", data, "-o", opts, "-w", "-l", filepath.Join(dir, "log"), "start").CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "log"))
		t.Fatalf("pgtest: pg_ctl start: %v\n%s\n%s", err, out, log)
	}
	t.Cleanup(func() {
		if out, err := s.run(filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop").CombinedOutput(); err != nil {
			t.Errorf("pgtest: pg_ctl stop: %v\n%s", err, out)
		}
	})
	return s
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

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

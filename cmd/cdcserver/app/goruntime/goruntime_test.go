package goruntime

import (
	"errors"
	"flag"
	"io"
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/cdcflow/eventservice/internal/optcheck"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Each setting holds while serving and is put back after; a set GOGC,
// GOMAXPROCS or GOMEMLIMIT variable wins over its flag; zero leaves the
// runtime's.
func TestApplySetsAndRestores(t *testing.T) {
	gcBefore := debug.SetGCPercent(100)
	defer debug.SetGCPercent(gcBefore)
	procsBefore := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(procsBefore)
	limitBefore := debug.SetMemoryLimit(-1) // -1 reads it
	procsSet := procsBefore + 1             // differs from the current value on any machine
	const limitSet = 3 << 30

	s := Settings{GCPercent: 400, MaxProcs: procsSet, MemoryLimit: limitSet}
	noEnv := func(string) string { return "" }
	restore := s.Apply(noEnv)
	require.Equal(t, 400, debug.SetGCPercent(400), "--gc-percent holds while serving")
	require.Equal(t, procsSet, runtime.GOMAXPROCS(0), "--max-procs holds while serving")
	require.Equal(t, int64(limitSet), debug.SetMemoryLimit(-1), "--memory-limit holds while serving")
	restore()
	require.Equal(t, 100, debug.SetGCPercent(100), "the collector's target is put back")
	require.Equal(t, procsBefore, runtime.GOMAXPROCS(0), "GOMAXPROCS is put back")
	require.Equal(t, limitBefore, debug.SetMemoryLimit(-1), "the memory limit is put back")

	env := map[string]string{"GOGC": "50", "GOMAXPROCS": "3", "GOMEMLIMIT": "1GiB"}
	restore = s.Apply(func(k string) string { return env[k] })
	require.Equal(t, 100, debug.SetGCPercent(100), "a set GOGC wins over --gc-percent")
	require.Equal(t, procsBefore, runtime.GOMAXPROCS(0), "a set GOMAXPROCS wins over --max-procs")
	require.Equal(t, limitBefore, debug.SetMemoryLimit(-1), "a set GOMEMLIMIT wins over --memory-limit")
	restore()
	require.Equal(t, procsBefore, runtime.GOMAXPROCS(0))

	restore = Settings{}.Apply(noEnv)
	require.Equal(t, 100, debug.SetGCPercent(100), "0 leaves the runtime's")
	require.Equal(t, procsBefore, runtime.GOMAXPROCS(0), "0 leaves the runtime's")
	require.Equal(t, limitBefore, debug.SetMemoryLimit(-1), "0 leaves the runtime's")
	restore()
}

// --memory-limit reads GOMEMLIMIT's syntax, and refuses what is not a
// non-negative size or overflows.
func TestMemoryLimitFlagParsesGOMEMLIMITSyntax(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "2147483648": 2 << 30, "1900MiB": 1900 << 20, "2GiB": 2 << 30, "512KiB": 512 << 10,
		"100B": 100, "1TiB": 1 << 40, " 3GiB ": 3 << 30,
	} {
		var s Settings
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		s.BindFlags(fs, "serve")
		require.NoError(t, fs.Parse([]string{"--memory-limit", in}), in)
		require.Equal(t, want, s.MemoryLimit, in)
	}
	for _, bad := range []string{"", "-1", "2GB", "1.5GiB", "GiB", "9000000TiB", "x"} {
		var s Settings
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		s.BindFlags(fs, "serve")
		require.Error(t, fs.Parse([]string{"--memory-limit", bad}), bad)
	}
}

// Check refuses each out-of-range setting with the sentinel.
func TestCheckRefusesOutOfRange(t *testing.T) {
	errBad := errors.New("bad")
	check := func(s Settings) error {
		p := optcheck.New(errBad)
		s.Check(p)
		return p.Err()
	}
	for _, good := range []Settings{{}, {GCPercent: 25}, {GCPercent: 10000, MaxProcs: 1024, MemoryLimit: 64 << 20}} {
		require.NoError(t, check(good), "%+v", good)
	}
	for _, bad := range []Settings{{GCPercent: 5}, {GCPercent: 10001}, {MaxProcs: -1}, {MaxProcs: 1025}, {MemoryLimit: 1 << 20}, {MemoryLimit: -1}} {
		require.ErrorIs(t, check(bad), errBad, "%+v", bad)
	}
}

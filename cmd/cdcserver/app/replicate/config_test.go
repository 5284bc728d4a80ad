package replicate

import (
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/pgsource"
)

// --gc-percent and --max-procs hold while serving and are put back after;
// a set GOGC or GOMAXPROCS variable wins over its flag.
func TestSetRuntimeAppliesAndRestores(t *testing.T) {
	gcBefore := debug.SetGCPercent(100)
	defer debug.SetGCPercent(gcBefore)
	procsBefore := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(procsBefore)
	procsSet := procsBefore + 1 // differs from the current value on any machine

	cfg := DefaultConfig()
	cfg.GCPercent, cfg.MaxProcs = 400, procsSet
	noEnv := func(string) string { return "" }
	restore := setRuntime(cfg, noEnv)
	require.Equal(t, 400, debug.SetGCPercent(400), "--gc-percent holds while serving")
	require.Equal(t, procsSet, runtime.GOMAXPROCS(0), "--max-procs holds while serving")
	restore()
	require.Equal(t, 100, debug.SetGCPercent(100), "the collector's target is put back")
	require.Equal(t, procsBefore, runtime.GOMAXPROCS(0), "GOMAXPROCS is put back")

	env := map[string]string{"GOGC": "50", "GOMAXPROCS": "3"}
	restore = setRuntime(cfg, func(k string) string { return env[k] })
	require.Equal(t, 100, debug.SetGCPercent(100), "a set GOGC wins over --gc-percent")
	require.Equal(t, procsBefore, runtime.GOMAXPROCS(0), "a set GOMAXPROCS wins over --max-procs")
	restore()
	require.Equal(t, procsBefore, runtime.GOMAXPROCS(0))

	cfg.GCPercent, cfg.MaxProcs = 0, 0
	restore = setRuntime(cfg, noEnv)
	require.Equal(t, 100, debug.SetGCPercent(100), "0 leaves the runtime's")
	require.Equal(t, procsBefore, runtime.GOMAXPROCS(0), "0 leaves the runtime's")
	restore()

	cfg.Source, cfg.Sink = "postgres://a@127.0.0.1/x", "postgres://b@127.0.0.1/y"
	for _, good := range []int{0, 1, 1024} {
		cfg.MaxProcs = good
		require.NoError(t, cfg.Validate(), "--max-procs %d", good)
	}
	for _, bad := range []int{-1, 1025} {
		cfg.MaxProcs = bad
		require.ErrorIs(t, cfg.Validate(), ErrInvalidConfig, "--max-procs %d", bad)
	}
}

// --source-read-linger: 0 turns it off, up to a second is taken, a negative
// value or more than a second is refused.
func TestSourceReadLingerIsValidated(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Source, cfg.Sink = "postgres://a@127.0.0.1/x", "postgres://b@127.0.0.1/y"
	require.Equal(t, pgsource.DefaultReadLinger, cfg.SourceReadLinger)
	for _, good := range []time.Duration{0, time.Millisecond, time.Second} {
		cfg.SourceReadLinger = good
		require.NoError(t, cfg.Validate(), "--source-read-linger %v", good)
	}
	for _, bad := range []time.Duration{-time.Millisecond, time.Second + 1} {
		cfg.SourceReadLinger = bad
		require.ErrorIs(t, cfg.Validate(), ErrInvalidConfig, "--source-read-linger %v", bad)
	}
}

package tests

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"
)

// Environment variables (see doc.go).
const (
	envScale      = "CDCFLOW_SCALE"
	envSoak       = "CDCFLOW_SOAK"
	envSeed       = "CDCFLOW_SEED"
	envModelSeed  = "CDCFLOW_MODEL_SEED"
	envModelSeeds = "CDCFLOW_MODEL_SEEDS"
	envModelBase  = "CDCFLOW_MODEL_SEED_BASE"
	envCrashSeed  = "CDCFLOW_CRASH_SEED"
)

// soakScale is the scale CDCFLOW_SOAK=1 implies when CDCFLOW_SCALE is unset.
const soakScale = 4

// scale is the size multiplier of the scenarios: CDCFLOW_SCALE, or
// soakScale under CDCFLOW_SOAK=1, or 1. Durations, row counts and (where
// the issue does not fix them) dispatcher counts grow with it.
func scale(t testing.TB) int {
	if v := os.Getenv(envScale); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive integer", envScale, v)
		}
		return n
	}
	if os.Getenv(envSoak) == "1" {
		return soakScale
	}
	return 1
}

// scaled returns d multiplied by the scale.
func scaled(t testing.TB, d time.Duration) time.Duration { return d * time.Duration(scale(t)) }

// envUint returns the unsigned integer in env var name, or def when unset.
func envUint(t testing.TB, name string, def uint64) uint64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("%s=%q: want an unsigned integer", name, v)
	}
	return n
}

// scenarioSeed returns the seed of a randomised scenario: CDCFLOW_SEED if
// set, else def. It is logged, and printed again if the test fails, so a
// failure can be replayed.
func scenarioSeed(t *testing.T, def uint64) uint64 {
	seed := envUint(t, envSeed, def)
	t.Logf("seed %d (replay with %s=%d)", seed, envSeed, seed)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("FAILED with seed %d: replay with %s=%d go test -race -run '^%s$' ./tests/", seed, envSeed, seed, t.Name())
		}
	})
	return seed
}

// scenario is one row of the closing report: every scenario logs it, so
// `go test -v ./tests/ | grep SCENARIO` prints the table.
type scenario struct {
	name        string
	dispatchers int
	rows        int64
	faults      string
	resets      uint64
}

// report logs s as a table row when the test ends, with its result.
func report(t *testing.T, s *scenario) {
	t.Cleanup(func() {
		result := "ok"
		if t.Failed() {
			result = "FAIL"
		}
		t.Logf("SCENARIO | %-26s | dispatchers %6d | rows %8d | faults %-44s | resets %6d | %s",
			s.name, s.dispatchers, s.rows, s.faults, s.resets, result)
	})
}

func fmtFaults(format string, args ...any) string { return fmt.Sprintf(format, args...) }

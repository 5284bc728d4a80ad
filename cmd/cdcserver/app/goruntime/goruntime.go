package goruntime

import (
	"flag"
	"fmt"
	"math"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/cdcflow/eventservice/internal/optcheck"
)

// Settings are the runtime settings; each field is one flag.
type Settings struct {
	// GCPercent is the Go collector's target (GOGC) while serving; 0
	// leaves the runtime's (the GOGC environment variable, or 100).
	GCPercent int
	// MaxProcs caps the Go scheduler's processors (GOMAXPROCS) while
	// serving; 0 leaves the runtime's (the CPUs available).
	MaxProcs int
	// MemoryLimit is the Go runtime's soft memory limit in bytes
	// (GOMEMLIMIT) while serving; 0 leaves the runtime's (none). Under it
	// the collector runs as often as it must to keep the heap, the stacks
	// and the runtime's own memory within it, whatever GCPercent says: a
	// container's limit without the GOGC doubling of a large live heap,
	// paid for in collector CPU when the live heap comes near it.
	MemoryLimit int64
}

// minMemoryLimit is the least --memory-limit accepted: below it the
// runtime and the event store's own buffers alone would keep the
// collector running without pause.
const minMemoryLimit = 64 << 20

// BindFlags registers the settings on fs, with s's values as defaults;
// who names the command in the help ("serve").
func (s *Settings) BindFlags(fs *flag.FlagSet, who string) {
	fs.IntVar(&s.GCPercent, "gc-percent", s.GCPercent, "the Go collector's target while serving (GOGC; 0 = the runtime's; a set GOGC variable wins): above 100 trades heap for less CPU per row")
	fs.IntVar(&s.MaxProcs, "max-procs", s.MaxProcs, fmt.Sprintf("at most this many threads run %s's Go code at once (GOMAXPROCS; 0 = the runtime's, one per CPU; a set GOMAXPROCS variable wins): 1 keeps %s to one core on a host it shares with a database", who, who))
	fs.Var((*ByteSize)(&s.MemoryLimit), "memory-limit", "the Go runtime's soft memory limit while serving, a `size` in bytes or with a unit (1900MiB, 2GiB; GOMEMLIMIT's syntax; 0 = the runtime's, none; a set GOMEMLIMIT variable wins): the collector then runs as often as keeping within it takes, paid for in CPU when the live heap comes near it")
}

// Check adds a problem to p for each invalid setting.
func (s Settings) Check(p *optcheck.Problems) {
	p.Require(s.GCPercent == 0 || s.GCPercent >= 25 && s.GCPercent <= 10000, "--gc-percent must be 0 or 25..10000")
	p.IntRange("--max-procs", s.MaxProcs, 0, 1024)
	p.Require(s.MemoryLimit == 0 || s.MemoryLimit >= minMemoryLimit, "--memory-limit %d must be 0 or at least 64MiB", s.MemoryLimit)
}

// Apply sets each nonzero setting unless the environment variable of the
// same setting is set (getenv), and returns what puts the previous ones
// back.
func (s Settings) Apply(getenv func(string) string) (restore func()) {
	gcBefore, procsBefore, limitBefore := -2, 0, int64(-1) // not changed (-1 is GOGC "off")
	if s.GCPercent > 0 && getenv("GOGC") == "" {
		gcBefore = debug.SetGCPercent(s.GCPercent)
	}
	if s.MaxProcs > 0 && getenv("GOMAXPROCS") == "" {
		procsBefore = runtime.GOMAXPROCS(s.MaxProcs)
	}
	if s.MemoryLimit > 0 && getenv("GOMEMLIMIT") == "" {
		limitBefore = debug.SetMemoryLimit(s.MemoryLimit)
	}
	return func() {
		if gcBefore != -2 {
			debug.SetGCPercent(gcBefore)
		}
		if procsBefore > 0 {
			runtime.GOMAXPROCS(procsBefore)
		}
		if limitBefore >= 0 {
			debug.SetMemoryLimit(limitBefore)
		}
	}
}

// ByteSize is a flag.Value of bytes written as GOMEMLIMIT is: an integer
// with an optional unit, B, KiB, MiB, GiB or TiB (every size flag of
// cdcserver's).
type ByteSize int64

var byteUnits = []struct {
	suffix string
	shift  uint
}{{"TiB", 40}, {"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}}

func (b *ByteSize) String() string { return strconv.FormatInt(int64(*b), 10) }

func (b *ByteSize) Set(v string) error {
	n, err := ParseBytes(v)
	if err != nil {
		return err
	}
	*b = ByteSize(n)
	return nil
}

// ParseBytes parses v as GOMEMLIMIT's syntax: a non-negative integer with
// an optional unit (B, KiB, MiB, GiB, TiB).
func ParseBytes(v string) (int64, error) {
	num, shift := strings.TrimSpace(v), uint(0)
	for _, u := range byteUnits {
		if rest, ok := strings.CutSuffix(num, u.suffix); ok {
			num, shift = rest, u.shift
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q: want a non-negative number of bytes with an optional unit (B, KiB, MiB, GiB, TiB)", v)
	}
	if n > math.MaxInt64>>shift {
		return 0, fmt.Errorf("%q: too large", v)
	}
	return n << shift, nil
}

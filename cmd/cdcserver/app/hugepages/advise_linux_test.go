package hugepages

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/clock"
)

// advisedAt reports whether the mapping holding addr carries the kernel's
// MADV_HUGEPAGE flag ("hg" in its VmFlags, /proc/self/smaps).
func advisedAt(t *testing.T, addr uintptr) bool {
	t.Helper()
	f, err := os.Open("/proc/self/smaps")
	require.NoError(t, err)
	defer f.Close()
	sc := bufio.NewScanner(f)
	in := false
	for sc.Scan() {
		line := sc.Text()
		if lo, hi, ok := anonymousWritable([]byte(line)); ok || isMappingLine(line) {
			in = ok && uint64(addr) >= lo && uint64(addr) < hi
			continue
		}
		if in && strings.HasPrefix(line, "VmFlags:") {
			for _, fl := range strings.Fields(line)[1:] {
				if fl == "hg" {
					return true
				}
			}
			return false
		}
	}
	require.NoError(t, sc.Err())
	t.Fatalf("no anonymous writable mapping holds %#x", addr)
	return false
}

// isMappingLine reports whether an smaps line starts a mapping ("lo-hi ...").
func isMappingLine(line string) bool {
	r, _, ok := strings.Cut(line, " ")
	if !ok {
		return false
	}
	lo, _, ok := strings.Cut(r, "-")
	_, err := strconv.ParseUint(lo, 16, 64)
	return ok && err == nil
}

// bigBuffer allocates and touches a buffer large enough to need memory the
// heap had not mapped before (the runtime maps 64 MiB arenas; the buffer's
// start may share the last one, its end cannot).
func bigBuffer() []byte {
	b := make([]byte, 192<<20)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	return b
}

// The two tests below each run in a fresh process (this test binary again,
// one test selected, helperEnv set): whether a mapping is advised before
// Advise can only be known in a process where nothing advised it yet.
const helperEnv = "HUGEPAGES_TEST_HELPER"

// inFreshProcess runs test name in a new process and fails with its output
// if it fails; it reports false in the helper itself, which then runs the
// test's body.
func inFreshProcess(t *testing.T, name string) bool {
	t.Helper()
	if os.Getenv(helperEnv) != "" {
		return false
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+name+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "PASS")
	return true
}

// TestAdviseMarksTheHeapForHugePages: a large heap buffer's mapping is not
// advised until Advise runs, and is after it.
func TestAdviseMarksTheHeapForHugePages(t *testing.T) {
	if inFreshProcess(t, "TestAdviseMarksTheHeapForHugePages") {
		return
	}
	b := bigBuffer()
	addr := uintptr(unsafe.Pointer(&b[len(b)-1]))
	// The runtime advises nothing; the sysfs mode does not set the flag.
	require.False(t, advisedAt(t, addr), "advised before Advise")
	n, err := Advise()
	require.NoError(t, err)
	require.GreaterOrEqual(t, n, int64(len(b)))
	require.True(t, advisedAt(t, addr), "not advised after Advise")
	require.Equal(t, byte(1), b[0], "the contents are untouched")
}

// TestTheKeeperAdvisesWhatTheHeapGrowsBy: memory mapped after Start is
// advised by the next periodic pass (the injected clock's tick), not
// before.
func TestTheKeeperAdvisesWhatTheHeapGrowsBy(t *testing.T) {
	if inFreshProcess(t, "TestTheKeeperAdvisesWhatTheHeapGrowsBy") {
		return
	}
	fake := clock.NewFake(time.Unix(1_800_000_000, 0))
	k, err := New(Options{Interval: time.Second, Clock: fake})
	require.NoError(t, err)
	passed := make(chan struct{}, 1)
	k.passed = func() { passed <- struct{}{} }
	require.NoError(t, k.Start())
	defer k.Close()
	b := bigBuffer()
	addr := uintptr(unsafe.Pointer(&b[len(b)-1]))
	require.False(t, advisedAt(t, addr), "a mapping made after Start is advised only at the next pass")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, fake.WaitWaiters(ctx, 1))
	fake.Advance(time.Second)
	select {
	case <-passed:
	case <-ctx.Done():
		t.Fatal("no pass after the interval")
	}
	require.True(t, advisedAt(t, addr), "not advised by the pass")
}

func TestAnonymousWritableParsesOnlyAnonymousPrivateWritableMappings(t *testing.T) {
	for line, want := range map[string]bool{
		"c000000000-c004000000 rw-p 00000000 00:00 0":         true,
		"c000000000-c004000000 r--p 00000000 00:00 0":         false,
		"c000000000-c004000000 rw-s 00000000 00:00 0":         false,
		"7f00-8f00 rw-p 00000000 00:00 0 [stack]":             false,
		"7f00-8f00 rw-p 00000000 08:01 1234 /usr/lib/libc.so": false,
		"zz-8f00 rw-p 00000000 00:00 0":                       false,
		"8f00-7f00 rw-p 00000000 00:00 0":                     false,
		"":                                                    false,
	} {
		_, _, ok := anonymousWritable([]byte(line))
		require.Equal(t, want, ok, "%q", line)
	}
}

// FuzzAnonymousWritable: any line parses without a panic, and a range it
// accepts is non-empty.
func FuzzAnonymousWritable(f *testing.F) {
	f.Add([]byte("c000000000-c004000000 rw-p 00000000 00:00 0"))
	f.Add([]byte("7f00-8f00 rw-p 00000000 08:01 1234 /usr/lib/libc.so"))
	f.Add([]byte("-- rw-p a b c"))
	f.Fuzz(func(t *testing.T, line []byte) {
		if lo, hi, ok := anonymousWritable(line); ok && hi <= lo {
			t.Fatalf("%q: accepted an empty range %#x-%#x", line, lo, hi)
		}
	})
}

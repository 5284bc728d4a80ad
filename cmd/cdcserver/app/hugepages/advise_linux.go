package hugepages

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"syscall"
)

// madvHugePage is MADV_HUGEPAGE (linux/mman.h).
const madvHugePage = 14

// Advise adds MADV_HUGEPAGE to every private, writable, anonymous mapping
// of at least MinBytes and returns how many bytes they span.
func Advise() (int64, error) {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return 0, fmt.Errorf("hugepages: %w", err)
	}
	var advised int64
	var firstErr error
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		lo, hi, ok := anonymousWritable(sc.Bytes())
		if !ok || hi-lo < MinBytes {
			continue
		}
		// The range is this process's own mapping, read from the kernel a
		// moment ago; madvise does not touch its contents. (A raw call:
		// syscall.Madvise takes a slice, which would need the address
		// turned into a pointer.)
		if _, _, errno := syscall.Syscall(syscall.SYS_MADVISE, uintptr(lo), uintptr(hi-lo), madvHugePage); errno != 0 {
			err := error(errno)
			// ENOMEM: unmapped since the read; EINVAL: a kernel without
			// THP. Either way the others are still worth advising.
			if firstErr == nil {
				firstErr = fmt.Errorf("hugepages: madvise %#x-%#x: %w", lo, hi, err)
			}
			continue
		}
		advised += int64(hi - lo)
	}
	if advised == 0 && firstErr != nil {
		return 0, firstErr
	}
	return advised, nil
}

// anonymousWritable parses one line of /proc/self/maps ("lo-hi perms
// offset dev inode [path]") and reports the range of a private, writable
// mapping without a path (anonymous; "[heap]", "[stack]" and files have
// one).
func anonymousWritable(line []byte) (lo, hi uint64, ok bool) {
	f := bytes.Fields(line)
	if len(f) != 5 || len(f[1]) != 4 || f[1][1] != 'w' || f[1][3] != 'p' {
		return 0, 0, false
	}
	r := bytes.SplitN(f[0], []byte{'-'}, 2)
	if len(r) != 2 {
		return 0, 0, false
	}
	lo, err1 := strconv.ParseUint(string(r[0]), 16, 64)
	hi, err2 := strconv.ParseUint(string(r[1]), 16, 64)
	if err1 != nil || err2 != nil || hi <= lo {
		return 0, 0, false
	}
	return lo, hi, true
}

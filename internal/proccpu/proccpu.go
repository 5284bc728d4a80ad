package proccpu

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTick is the unit of /proc/<pid>/stat's times (USER_HZ, 100 on
// Linux everywhere it matters).
const clockTick = 10 * time.Millisecond

// Stat is one process's CPU times from /proc/<pid>/stat: its own
// (utime+stime) and its reaped children's (cutime+cstime), and its parent.
type Stat struct {
	Self, Reaped time.Duration
	PPID         int
}

// Read reads pid's Stat.
func Read(pid int) (Stat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return Stat{}, err
	}
	// The command name is in parentheses and may hold spaces: the fields
	// start after the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return Stat{}, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return Stat{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	// After the name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
	var n [5]int64
	for k, idx := range []int{1, 11, 12, 13, 14} {
		if n[k], err = strconv.ParseInt(f[idx], 10, 64); err != nil {
			return Stat{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
	}
	return Stat{PPID: int(n[0]), Self: time.Duration(n[1]+n[2]) * clockTick, Reaped: time.Duration(n[3]+n[4]) * clockTick}, nil
}

// Tree is the CPU time a process and its children have used: its own,
// its reaped children's and its live children's (a postmaster and its
// backends, which are all its direct children). A child that exits
// between the reads is missed or counted once, not twice, within a tick
// or so of its time.
func Tree(root int) (time.Duration, error) {
	parts, err := TreeBy(root, nil)
	return parts[""], err
}

// Exited is TreeBy's key for the CPU time of the root itself and of its
// children that have exited (a postmaster's autovacuum workers, mostly).
const Exited = "exited"

// TreeBy is Tree split by kind: each live child's time under what kind
// says of its title (its command line, which PostgreSQL rewrites to say
// what a backend is: "postgres: walsender ...", "postgres: autovacuum
// worker ..."), the root's own and its reaped children's under Exited.
// A nil kind puts everything under "" and reads no titles. A child's time
// moves from its kind to Exited when it exits, so a kind whose children
// come and go is read together with Exited.
func TreeBy(root int, kind func(title string) string) (map[string]time.Duration, error) {
	st, err := Read(root)
	if err != nil {
		return nil, err
	}
	key := func(k string) string {
		if kind == nil {
			return ""
		}
		return k
	}
	parts := map[string]time.Duration{key(Exited): st.Self + st.Reaped}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == root {
			continue
		}
		c, err := Read(pid)
		if err != nil || c.PPID != root {
			continue // gone, or not a child
		}
		k := ""
		if kind != nil {
			title, err := Title(pid)
			if err != nil {
				continue // gone
			}
			k = kind(title)
		}
		parts[k] += c.Self + c.Reaped
	}
	return parts, nil
}

// Title is pid's command line, its arguments joined by spaces.
func Title(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " ")), nil
}

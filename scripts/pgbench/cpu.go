package main

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

// procStat is one process's CPU times from /proc/<pid>/stat: its own
// (utime+stime) and its reaped children's (cutime+cstime), and its parent.
type procStat struct {
	self, reaped time.Duration
	ppid         int
}

func readProcStat(pid int) (procStat, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, err
	}
	// The command name is in parentheses and may hold spaces: the fields
	// start after the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	// After the name: state(0) ppid(1) ... utime(11) stime(12) cutime(13) cstime(14).
	var n [5]int64
	for k, idx := range []int{1, 11, 12, 13, 14} {
		if n[k], err = strconv.ParseInt(f[idx], 10, 64); err != nil {
			return procStat{}, fmt.Errorf("/proc/%d/stat: %w", pid, err)
		}
	}
	return procStat{ppid: int(n[0]), self: time.Duration(n[1]+n[2]) * clockTick, reaped: time.Duration(n[3]+n[4]) * clockTick}, nil
}

// treeCPU is the CPU time a process and its children have used: its own,
// its reaped children's and its live children's (a postmaster and its
// backends, which are all its direct children). A child that exits
// between the reads is missed or counted once, not twice, within a tick
// or so of its time.
func treeCPU(root int) (time.Duration, error) {
	st, err := readProcStat(root)
	if err != nil {
		return 0, err
	}
	total := st.self + st.reaped
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == root {
			continue
		}
		c, err := readProcStat(pid)
		if err != nil || c.ppid != root {
			continue // gone, or not a child
		}
		total += c.self + c.reaped
	}
	return total, nil
}

// cpuParts are the three places a configuration spends CPU: the source
// server, the target server and the changefeed's own process (none for
// native replication, whose apply worker is the target's).
type cpuParts [3]time.Duration

// cpuMeter reads cpuParts: pids of the source's and the target's
// postmasters (0: absent) and a func giving the changefeed process's CPU
// time so far (nil: none).
type cpuMeter struct {
	src, dst int
	feed     func() (time.Duration, error)
}

// present reports which of the parts the meter reads.
func (m cpuMeter) present() [3]bool { return [3]bool{m.src != 0, m.dst != 0, m.feed != nil} }

func (m cpuMeter) read() (cpuParts, error) {
	var p cpuParts
	var err error
	if m.src != 0 {
		if p[0], err = treeCPU(m.src); err != nil {
			return p, err
		}
	}
	if m.dst != 0 {
		if p[1], err = treeCPU(m.dst); err != nil {
			return p, err
		}
	}
	if m.feed != nil {
		if p[2], err = m.feed(); err != nil {
			return p, err
		}
	}
	return p, nil
}

// perRow is the CPU each present part spent per row between two
// readings, in µs, with their total last; -1 for a part not present, and
// throughout when no row was written.
func perRow(from, to cpuParts, present [3]bool, rows int) [4]float64 {
	out := [4]float64{-1, -1, -1, -1}
	if rows <= 0 {
		return out
	}
	out[3] = 0
	for i := range from {
		if !present[i] {
			continue
		}
		us := float64((to[i] - from[i]).Microseconds()) / float64(rows)
		out[i] = us
		out[3] += us
	}
	return out
}

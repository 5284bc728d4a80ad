package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/cdcflow/eventservice/internal/proccpu"
)

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
		if p[0], err = proccpu.Tree(m.src); err != nil {
			return p, err
		}
	}
	if m.dst != 0 {
		if p[1], err = proccpu.Tree(m.dst); err != nil {
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

// series logs, every period until stop is called, the rows committed
// in that period (rows/s) and the CPU each present part spent per row
// in it: a run's time series, which shows what a run's totals hide (a
// slow start, the minutes when autovacuum analyzes every table). stop
// returns the rows/s of each whole period.
func (m cpuMeter) series(period time.Duration, rows func() int64, logf func(format string, args ...any)) (stop func() []float64) {
	done := make(chan struct{})
	finished := make(chan []float64, 1)
	go func() {
		var rates []float64
		defer func() { finished <- rates }()
		tick := time.NewTicker(period)
		defer tick.Stop()
		start := time.Now()
		prev, err := m.read()
		if err != nil {
			logf(" time series: %v", err)
			return
		}
		prevSrc := m.sourceParts()
		prevAt, prevRows := start, rows()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			now, err := m.read()
			if err != nil {
				logf(" time series: %v", err)
				return
			}
			// The rate over the time the window really took: a late tick
			// makes a longer window, not a faster one.
			at, n := time.Now(), rows()
			rate := float64(n-prevRows) / at.Sub(prevAt).Seconds()
			rates = append(rates, rate)
			pr := perRow(prev, now, m.present(), int(n-prevRows))
			src := m.sourceParts()
			logf("  t=%3.0fs %6.0f rows/s, CPU µs/row source %s target %s changefeed %s all %s; source: %s",
				at.Sub(start).Seconds(), rate, num(pr[0], 0), num(pr[1], 0), num(pr[2], 0), num(pr[3], 0),
				splitPerRow(prevSrc, src, int(n-prevRows)))
			prev, prevSrc, prevAt, prevRows = now, src, at, n
		}
	}()
	return func() []float64 { close(done); return <-finished }
}

// The parts of a PostgreSQL server that the time series splits the
// source's CPU into, in the order it prints them.
var serverParts = []string{"backends", "walsender", "autovacuum", "other"}

// serverPart names the part a PostgreSQL server's child belongs to from
// the title PostgreSQL gives it ("postgres: walsender ...").
func serverPart(title string) string {
	rest, ok := strings.CutPrefix(title, "postgres: ")
	if !ok {
		return "other"
	}
	switch {
	case strings.HasPrefix(rest, "walsender"):
		return "walsender"
	case strings.HasPrefix(rest, "autovacuum worker"):
		return "autovacuum"
	}
	for _, aux := range []string{"checkpointer", "background writer", "walwriter", "autovacuum launcher",
		"logical replication launcher", "archiver", "stats collector", "logical replication worker"} {
		if strings.HasPrefix(rest, aux) {
			return "other"
		}
	}
	return "backends" // a client's: "postgres: <user> <database> <host> <state>"
}

// sourceParts is the source server's CPU by part, with its exited
// children (autovacuum workers, mostly: a worker's time moves there when
// it exits) counted as autovacuum; nil when unknown.
func (m cpuMeter) sourceParts() map[string]time.Duration {
	if m.src == 0 {
		return nil
	}
	parts, err := proccpu.TreeBy(m.src, serverPart)
	if err != nil {
		return nil
	}
	parts["autovacuum"] += parts[proccpu.Exited]
	delete(parts, proccpu.Exited)
	return parts
}

// splitPerRow formats what each part of the source spent per row between
// two sourceParts readings.
func splitPerRow(from, to map[string]time.Duration, rows int) string {
	if from == nil || to == nil || rows <= 0 {
		return "-"
	}
	var b strings.Builder
	for i, p := range serverParts {
		if i > 0 {
			b.WriteString(" ")
		}
		fmt.Fprintf(&b, "%s %.0f", p, float64((to[p]-from[p]).Microseconds())/float64(rows))
	}
	return b.String()
}

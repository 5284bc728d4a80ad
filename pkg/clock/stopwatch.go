package clock

import "time"

// Stopwatch measures real elapsed time, whatever Clock a component was
// given. A Clock decides: cadences, timeouts, TTLs, lag. A Stopwatch only
// reports how long something took (a notifier callback, a scan, a sink
// call) for a latency metric, and that is real time even under a Fake
// clock, which would report zero. This file and Real are the only places
// in pkg/ that read the wall clock (tests/hygiene_test.go checks).
type Stopwatch struct{ start time.Time }

// StartStopwatch starts a stopwatch now.
func StartStopwatch() Stopwatch { return Stopwatch{start: time.Now()} }

// Elapsed is the real time since the stopwatch started (monotonic).
func (s Stopwatch) Elapsed() time.Duration { return time.Since(s.start) }

// RealDeadline is the wall-clock instant d from now, for the operating
// system's deadlines (a socket's read deadline), which count real time:
// a component computes d on its Clock, then hands the OS this.
func RealDeadline(d time.Duration) time.Time { return time.Now().Add(d) }

// RealSleep waits d of real time, whatever the Clock: for a wait that lets
// the operating system gather data (a socket's receive queue fills in real
// time), never for a decision, which takes its time from a Clock.
func RealSleep(d time.Duration) { time.Sleep(d) }

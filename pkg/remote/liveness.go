package remote

import (
	"sync/atomic"
	"time"

	"github.com/cdcflow/eventservice/pkg/clock"
)

// linkWatch is what a stream's watchdog reads: when a frame last arrived
// and when the write in progress began. Times are durations since the
// stream opened, from Sub on the injected clock's readings: the real
// clock's carry Go's monotonic reading, so a step of the wall clock (NTP,
// a resumed VM) neither declares a healthy link dead nor hides a dead one.
type linkWatch struct {
	clk        clock.Clock
	base       time.Time
	recv       atomic.Int64 // since base, of the last frame received
	writeStart atomic.Int64 // since base, plus one, of the write in progress; 0: none
	wrote      atomic.Bool  // a frame went out since the last ping tick
}

// linkState says whether a link is alive.
type linkState int

const (
	linkAlive   linkState = iota
	linkSilent            // nothing arrived for the timeout
	linkStalled           // a write blocked for the timeout
)

func newLinkWatch(clk clock.Clock) *linkWatch { return &linkWatch{clk: clk, base: clk.Now()} }

func (w *linkWatch) now() int64 { return int64(w.clk.Now().Sub(w.base)) }

// received notes that a frame arrived.
func (w *linkWatch) received() { w.recv.Store(w.now()) }

// writing notes that a write begins; written that it ended.
func (w *linkWatch) writing() { w.writeStart.Store(w.now() + 1) }
func (w *linkWatch) written() {
	w.writeStart.Store(0)
	w.wrote.Store(true)
}

// idleSinceLastTick reports whether nothing was written since the last
// call (a ping is due), and starts the next interval.
func (w *linkWatch) idleSinceLastTick() bool { return !w.wrote.Swap(false) }

// pinged undoes what a ping's write noted: a ping does not make the next
// interval busy, or pings would go out every other tick.
func (w *linkWatch) pinged() { w.wrote.Store(false) }

// state judges the link against timeout.
func (w *linkWatch) state(timeout time.Duration) linkState {
	now := w.now()
	if now-w.recv.Load() > int64(timeout) {
		return linkSilent
	}
	if st := w.writeStart.Load(); st != 0 && now-(st-1) > int64(timeout) {
		return linkStalled
	}
	return linkAlive
}

package pgsource

import "time"

// liveness decides, from the time elapsed in a session and whether the
// server was heard since the last step, when the stream asks the server
// for a reply and when it calls the link silent (Options.ReceiveTimeout):
// once it has heard nothing for half the timeout it asks; if nothing
// comes by the other half it reads once more for lastChanceRead (a read
// that finds its deadline passed does not look at the socket) and then
// gives up. The clock for the second half starts at the ask, so a stall
// on this side (a push the store holds back) is not taken for silence.
// Pure: the session (stream.go) gives it the stopwatch's reading and what
// its socket counted, and does what it says.
type liveness struct {
	timeout time.Duration // 0: off
	// heard is when the server was last heard, asked when a reply was
	// asked for since, chance when the last read past the deadline began;
	// -1: not.
	heard, asked, chance time.Duration
}

// liveVerdict is what one step says.
type liveVerdict struct {
	// ask: send the status report with a reply requested, now.
	ask bool
	// silent: nothing came in time: end the session (ErrSourceSilent).
	silent bool
	// heardPastTimeout: the server was heard after the session outlived
	// a whole timeout (the streak of silent sessions ends).
	heardPastTimeout bool
	// wakeIn is how long until the next step is due.
	wakeIn time.Duration
	// quiet and sinceAsk describe a silence, for the error.
	quiet, sinceAsk time.Duration
}

func newLiveness(timeout time.Duration) liveness {
	return liveness{timeout: timeout, asked: -1, chance: -1}
}

// step applies the time elapsed el and whether anything arrived since the
// last step.
func (l *liveness) step(el time.Duration, heardNow bool) liveVerdict {
	var v liveVerdict
	half := l.timeout / 2
	if heardNow {
		v.heardPastTimeout = el > l.timeout
		l.heard, l.asked, l.chance = el, -1, -1
	}
	if l.asked < 0 && el >= l.heard+half {
		v.ask = true
		l.asked = el
	}
	due := l.heard + half
	if l.asked >= 0 {
		if due = l.asked + half; el >= due {
			if l.chance < 0 {
				l.chance = el
			}
			if due = l.chance + lastChanceRead; el >= due {
				v.silent, v.quiet, v.sinceAsk = true, el-l.heard, el-l.asked
			}
		}
	}
	v.wakeIn = due - el
	return v
}

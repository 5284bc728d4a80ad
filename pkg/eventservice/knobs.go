package eventservice

import "github.com/cdcflow/eventservice/pkg/messaging"

// testingKnobs are the service's test hooks, all in one place: tests set
// them before Start; in production they are zero and each costs one
// comparison. Each runs on the goroutine that reaches it.
type testingKnobs struct {
	// at runs when a worker or a control call reaches point p, with the
	// session or the dispatcher concerned (the other nil): a test holds a
	// goroutine there to force an interleaving.
	at func(p point, s *session, d *dispatcher)
	// stepped runs after each step of an owner (core.go), with the input
	// and the effects about to be carried out: the trace tests print them.
	stepped func(s *session, in input, fx []effect)
	// ended runs after a preparation's or a scan's end effect was carried
	// out (the transition fired, its follow-up done).
	ended func(s *session, e effect)
	// targetStopping runs when forget is about to stop the pump of a
	// target whose last dispatcher was removed (the target is already out
	// of the map and its metrics unregistered).
	targetStopping func(name messaging.Target)
	// keepaliveRound runs after each keepalive round with the number of
	// sessions it examined.
	keepaliveRound func(examined int)
}

// point names a place knobs.at can hold.
type point uint8

const (
	// pointBeforePrepare: a preparation worker owns s, before observing it.
	pointBeforePrepare point = iota
	// pointBeforeScan: a scan worker owns s, before reading the store.
	pointBeforeScan
	// pointScanChannelFull: a preparation worker found the scan channel
	// full and is about to wait for room.
	pointScanChannelFull
	// pointBeforePark: an owner that moved s to schema_blocked is about to
	// put it into the blocked set.
	pointBeforePark
	// pointBeforeFence: Remove retired d and ended its store registration,
	// and is about to wait for sends in flight.
	pointBeforeFence
	// pointBeforeReRegister: the registrar is about to retry d's store
	// registration (before taking d's lock).
	pointBeforeReRegister
	// pointCloseUnregistered: Close unregistered every dispatcher from the
	// store and is about to stop the workers.
	pointCloseUnregistered
)

// reach calls the at knob, if set.
func (k *testingKnobs) reach(p point, s *session, d *dispatcher) {
	if k.at != nil {
		k.at(p, s, d)
	}
}

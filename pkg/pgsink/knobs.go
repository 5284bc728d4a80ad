package pgsink

// testingKnobs are the sink's test hooks, all in one place (the project's
// one spelling of a test seam: eventservice, eventstore and eventcollector
// have theirs). Tests set them before the call they watch, never while a
// goroutine that reads them runs; in production they are nil and each
// costs one nil check on its path. Each runs on the goroutine that reaches
// it.
type testingKnobs struct {
	// enqueueWaits runs when a call found its lane holding QueueRows rows
	// queued or its share of QueueBytes, and is about to wait for room (lane.enqueue), under the lane's mu,
	// which the wait releases: it must not call into the sink. A test that
	// then takes the lane's mu finds the call waiting.
	enqueueWaits func()
}

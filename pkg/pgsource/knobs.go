package pgsource

// testingKnobs are the tests' seams into a Source, the package's one
// spelling of a test hook: set on Source.knobs by the package's own tests
// before Open, zero (no hook) otherwise.
type testingKnobs struct {
	// copyHook, if set (tests), runs after a copy's chunk is read and
	// before its high watermark is written.
	copyHook func(oid uint32, rows int)
	// copyStartHook, if set (tests), runs before each chunk's low
	// watermark (each attempt).
	copyStartHook func()
	// skipSyncRepCheck and skipRecentCheck (tests) turn off one of the two
	// ways a copy finds a commit its chunk's snapshot cannot see yet.
	skipSyncRepCheck, skipRecentCheck bool
	// replyHeard, if set (tests), runs on the stream's goroutine when a
	// message arrives after a reply was asked for (ReceiveTimeout).
	replyHeard func()
}

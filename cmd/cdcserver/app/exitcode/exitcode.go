// Package exitcode holds cdcserver's exit statuses, one set for every
// command, so that a script reads them the same way whatever it ran. A
// command returns one of these and nothing else; tests/deps_test.go keeps
// cmd/'s packages from defining their own.
//
// What each status means, per command:
//
//   - serve: OK a clean stop (SIGINT or SIGTERM); Failed the changefeed
//     stopped; Setup bad flags, a setup error or a refused start (refused
//     by its checks: nothing was changed; a failure after them leaves what
//     it made for the next start).
//   - status: OK nothing to act on; Failed problems listed; Setup bad
//     flags, or the changefeed cannot be read.
//   - compare: OK EQUAL; Failed DIFFERENT (the first table that differs
//     is named); Setup bad flags, or a table cannot be read.
//   - remove: OK removed (or nothing was left); Setup bad flags, refused
//     (a serve streams the slot and no --force; a slot registered for
//     another target) or failed.
//   - synthetic: OK verified (a --role collector process: stopped
//     cleanly); Failed verification failed (a violation proven from what
//     the sinks hold, drained or not); Setup bad flags or a setup error;
//     NotDrained some dispatcher had not reached the upstream's final
//     resolved-ts at the drain deadline (--drain-timeout) and nothing
//     delivered is wrong (delivery was behind, not lossy).
//   - cdcserver without a command (its commands listed), help and version:
//     OK; a command, or help on a command, that does not exist: Setup.
package exitcode

// The exit statuses.
const (
	// OK: the command did what it was asked (see the package's table).
	OK = 0
	// Failed: the command ran and found something wrong: serve's
	// changefeed stopped, status listed problems, compare found a table
	// that differs, synthetic's verification failed.
	Failed = 1
	// Setup: bad flags, a setup error or a refused start; nothing ran to
	// a verdict.
	Setup = 2
	// NotDrained: synthetic only: delivery had not caught up by
	// --drain-timeout, and nothing delivered is wrong.
	NotDrained = 3
)

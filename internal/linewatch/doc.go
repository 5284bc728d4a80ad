// Package linewatch is an io.Writer for tests that watch a process's log:
// it keeps everything written and reports each complete line that matches
// a pattern, so a test can act when the program under test says something
// (a port it listens on, a child's pid, "delivery done") instead of
// sleeping.
//
// Invariants: Write never blocks (a match nobody takes while the channel
// is full is dropped, and String still has it); lines are matched whole,
// however the writes split them; it starts no goroutine.
package linewatch

// Command cdcserver runs an embedded changefeed server end to end: a
// synthetic upstream feeds the pebble event store, the event service
// schedules scans and sends to one collector per changefeed over the
// in-process transport, and at the end the server verifies that every
// dispatcher received exactly the upstream's rows, in order, up to the
// final resolved-ts. See docs/reference/ for the flags; `make run` runs the
// defaults.
//
// With --role service (or --remote-collectors N) the event service serves
// collectors in other processes over gRPC; --role collector is such a
// process.
//
// `cdcserver serve --source postgres://... --sink postgres://...` is a
// long-running PostgreSQL-to-PostgreSQL changefeed (cmd/cdcserver/app/replicate);
// `cdcserver compare` checks the tables equal; `cdcserver --version`.
//
// Exit status: 0 verified (a collector: stopped cleanly); 1 verification
// failed (a violation proven from what the sinks hold, drained or not); 2
// bad flags or a setup error; 3 not drained: some dispatcher had not
// reached the upstream's final resolved-ts at the drain deadline and
// nothing delivered is wrong (delivery was behind, not lossy).
//
// Invariants: main only parses flags, runs app/synthetic or app/replicate
// and maps the outcome to an exit status of app/exitcode (0 to 3; serve,
// status, compare and remove use 0 to 2), the one place they are defined. run takes its stdout and stderr as arguments (the tests run it
// in-process); usage and setup errors go to stderr only, and a flag error
// exits 2 with nothing on stdout.
package main

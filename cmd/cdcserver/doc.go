// Command cdcserver is a changefeed of PostgreSQL logical replication into
// another PostgreSQL database, built on the event service library, and
// the library's synthetic benchmark. Without a command it lists its
// commands (`cdcserver --help` prints the same) and exits 0:
//
//   - `cdcserver serve --source postgres://... --sink postgres://...`
//     replicates until SIGTERM, and a restart resumes; `status` shows a
//     changefeed, `compare` checks the tables equal, `remove` removes it
//     (cmd/cdcserver/app/replicate; serve.go here).
//   - `cdcserver synthetic` runs the library end to end on a seeded
//     synthetic workload: a synthetic upstream feeds the pebble event
//     store, the event service schedules scans and sends to one collector
//     per changefeed, and at the end the server verifies that every
//     dispatcher received exactly the upstream's rows, in order, up to the
//     final resolved-ts (cmd/cdcserver/app/synthetic; synthetic.go here;
//     `make run` runs the defaults). With --role service (or
//     --remote-collectors N) the event service serves collectors in other
//     processes over gRPC; `cdcserver synthetic --role collector` is such
//     a process.
//   - `cdcserver help COMMAND` shows a command's flags; `cdcserver
//     version` (or --version) names the build.
//
// docs/reference/ has every command's flags.
//
// Invariants: main only parses flags, runs app/synthetic or app/replicate
// and maps the outcome to an exit status of app/exitcode, the one place
// they are defined, with what each means per command (0 to 3; serve,
// status, compare and remove use 0 to 2). run takes its stdout and stderr
// as arguments (the tests run it in-process); usage and setup errors go to
// stderr only, and a flag error exits 2 with nothing on stdout.
package main

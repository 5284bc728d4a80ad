// Package synthetic is the synthetic server, `cdcserver synthetic`: it
// wires the real parts into the embedded changefeed server that the
// end-to-end tests drive and the benchmarks measure: the pebble event
// store fed by the synthetic upstream, the in-memory schema store with
// scheduled DDLs, the event service, the in-process transport (optionally
// with injected faults) and one collector per changefeed, then verifies
// what the collectors received against what the upstream produced.
//
// Where each part is:
//
//   - server.go: the server: builds, starts and stops the parts (Run).
//   - monitor.go: the monitor: samples progress while the run goes on,
//     the warm-up, the drain and its deadline.
//   - verifier.go: the verifier: every dispatcher's sink against the
//     upstream's rows and the DDL schedule, after the run.
//   - summary.go: the verdict, the exit status for it and the printed
//     summary.
//   - remote.go: the service's side of collectors in other processes.
//   - supervisor.go: the supervisor of the collector processes
//     --remote-collectors starts (child).
//   - collectorprocess.go: the --role collector process (RunCollector).
//   - config.go (the flags), tls.go (mutual TLS, --authorize), meta.go
//     (a data directory's workload), schema.go (the DDL schedule),
//     mover.go (--move-interval), warmup.go (when the warm-up ends),
//     httpmetrics.go (/metrics and /debug/pprof).
//
// Invariants: Run owns every goroutine it starts and stops them all before
// it returns; it writes the summary (text or one JSON object) to stdout and
// everything else (logs, progress) to stderr; nothing is global.
package synthetic

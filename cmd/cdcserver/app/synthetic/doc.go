// Package synthetic is the synthetic server (cdcserver without a
// command): it wires the real parts into the embedded changefeed server that the
// end-to-end tests drive and the benchmarks measure: the pebble event
// store fed by the synthetic upstream, the in-memory schema store with
// scheduled DDLs, the event service, the in-process transport (optionally
// with injected faults) and one collector per changefeed, then verifies
// what the collectors received against what the upstream produced.
//
// Invariants: Run owns every goroutine it starts and stops them all before
// it returns; it writes the summary (text or one JSON object) to stdout and
// everything else (logs, progress) to stderr; nothing is global.
package synthetic

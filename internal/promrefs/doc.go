// Package promrefs reads what the deploy/ files name and what a process
// serves, for the tests that keep them in step: the metric families a
// Grafana dashboard's queries and a Prometheus rule file's expressions
// name, and the families a /metrics endpoint serves. A dashboard or a rule
// that names a metric no process exports shows nothing, or never fires.
//
// Invariants: every function is pure but for the reads it names; names
// are families (a histogram's _bucket, _sum and _count series under its
// family), each once, cdcflow's, the process's and the Go runtime's (not
// up, which Prometheus records itself).
package promrefs

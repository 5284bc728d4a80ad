// Command benchtable reads `go test -bench` output (several -count runs)
// and prints one table of medians per benchmark and metric, then the
// headline ratios of the project, each computed from medians measured in
// the same run.
//
// Usage: go run ./scripts/benchtable [-update] bench.out [cdcserver.json]
//
// The optional second file is the one JSON object `cdcserver synthetic --json` prints;
// its notify and lag figures follow the ratios.
//
// With -update it prints nothing and rewrites, instead, the generated
// blocks of the documents that quote it: the headline ratios and the
// server run in README.md (between <!-- benchtable:headline --> and
// <!-- /benchtable:headline -->), the table of medians in
// docs/benchmarks.md (<!-- benchtable:table --> ... <!-- /benchtable:table -->).
// Every figure is thus stated once, as this program computed it; prose
// names rows and never repeats a number.
//
// Invariants: without -update it writes only to stdout and stderr; with
// -update only inside the documents' benchtable:* blocks
// (docblock.Replace), never elsewhere. A headline ratio is of two medians
// of the same input, and one whose benchmark is missing (or whose
// denominator is zero) prints n/a, never a guess.
package main

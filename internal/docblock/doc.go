// Package docblock rewrites a generated block of a document: what lies
// between the lines <!-- name --> and <!-- /name -->. The benchmark
// scripts write their tables into README.md and docs/ with it, so a figure
// appears once, generated.
//
// Invariants: Replace changes only what lies between the first begin
// line and the end marker after it, both markers kept; a file without the
// block (or with the end marker before the begin line) is an error and
// is left untouched. The package holds no state.
package docblock

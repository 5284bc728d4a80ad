// Package refdoc renders the generated references of docs/reference/ and
// checks them against the documents. A reference is a block of a document,
// between the lines <!-- reference:NAME --> and <!-- /reference:NAME -->
// (internal/docblock), rendered by a test from what the code defines: a
// command's flag.FlagSet, the help text of a command, the metric families
// a running process registers (a registry it built, or a scrape of its
// /metrics). The test compares the block with what it rendered and fails,
// naming UpdateCommand, when they differ; run with -update it rewrites the
// block instead. The prose around a block is written by hand and never
// touched.
//
// Invariants: a rendering depends only on its input (flags in name order,
// metric families in name order, label names sorted), so a block changes
// only when the code does; Sync never writes without update, and with it
// writes only between the markers. The package holds no state.
package refdoc

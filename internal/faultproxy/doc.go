// Package faultproxy is a loopback TCP proxy for fault tests: it forwards
// to one target and can add latency, stall either direction (a peer that
// stops reading, or a request caught on the wire), reset every connection
// (a network fault) and partition (reset, and refuse new connections until
// healed).
//
// Invariants: every goroutine it starts ends when the test's cleanup runs;
// a stalled chunk is either forwarded (Release) or dropped with its
// connection (Reset, Partition); nothing is reordered.
package faultproxy

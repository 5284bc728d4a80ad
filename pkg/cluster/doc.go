// Package cluster runs changefeeds on several nodes coordinated through
// etcd (issue 59): nodes hold their membership under a lease, one node at
// a time is the coordinator (an etcd election), and the coordinator
// assigns each running changefeed to one live node.
//
// Decisions are pure functions, side effects a thin layer around them:
// Place (placement.go) decides a round of assignments from the live
// nodes and the changefeeds' desired states; the coordinator's loop
// reads them from etcd and writes the decisions, each guarded by its
// leadership, so that a deposed coordinator's late write fails.
//
// Invariants of Place:
//   - a running changefeed whose node is gone or draining is moved in the
//     round that sees it, whatever MaxBalanceMoves; a paused one is taken
//     off its node; one on no node is placed;
//   - each changefeed gets at most one decision a round, and a round over
//     a state that needs none decides nothing;
//   - a changefeed goes to the least loaded live node that is not
//     draining (ties by node ID), and moves made only to even the load are
//     at most MaxBalanceMoves a round: with room enough, loads end within
//     one of each other;
//   - the decisions do not depend on the order of the input.
package cluster

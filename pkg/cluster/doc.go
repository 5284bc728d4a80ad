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
// Membership (member.go): a node holds its key under a lease of its own
// and acts only while Valid, before a local deadline taken from the send
// of the last acknowledged keepalive plus the TTL minus a margin, on the
// monotonic clock; etcd expires the lease from its receipt of that
// keepalive, later, so the node has stopped before its changefeeds can be
// given to another. A lost lease is never revived.
//
// Election (coordinator.go): the coordinator's key's create revision is
// its fencing token; every write of the coordinator is a transaction
// guarded by that key at that revision (Leadership.Txn), so a deposed
// coordinator's write fails with ErrNotCoordinator.
//
// StartEmbedded (embed.go) runs an etcd member in the process: a node's
// one-machine default, and the tests' clusters of three.
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

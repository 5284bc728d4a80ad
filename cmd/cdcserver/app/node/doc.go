// Package node is `cdcserver server`: a node of a cluster of changefeeds
// coordinated through etcd (pkg/cluster). A node joins the cluster under
// a lease (an embedded single-member etcd in its data directory without
// --etcd), campaigns to be the coordinator, runs the changefeeds assigned
// to it (replicate.RunEmbedded, one each, isolated: its own event store,
// registry and goroutines; one that fails starts again after a back-off
// and never stops another), and serves the HTTP API (api.go) that
// `cdcserver cli` drives.
//
// Invariants:
//   - a changefeed runs here only while the node's membership is valid
//     and its assignment names this node; every transaction it sends to
//     the target is permitted by the membership's local deadline
//     (pgsink.Options.Permit), so none is sent once the lease could have
//     expired;
//   - a lost membership stops every changefeed and ends Run
//     (cluster.ErrLeaseLost): the node never revives a lease, a
//     supervisor starts it again as a new member;
//   - SIGTERM drains: the node marks itself draining, the coordinator
//     moves its changefeeds off (each a clean stop here, then a start
//     there that fences this node out of the target), and the node leaves
//     once none is assigned to it or DrainTimeout passed;
//   - the event stores of the node's changefeeds share one block cache
//     (--store-cache-size), in which each store's memtables
//     (--store-memtable-size each) reserve their size: what the stores
//     hold follows those two settings, not a cache per changefeed; each
//     run's store holds a reference to the cache while it is open, the
//     node its own until Run ends; the Go heap, the rows in flight of
//     every changefeed, follows the Go runtime's settings of the node
//     (--memory-limit, --gc-percent; a set GOMEMLIMIT or GOGC wins), each
//     changefeed's sink holding at most --sink-queue-size bytes of rows;
//   - a specification never holds a password (ErrClearPassword): a DSN
//     names a password file of the nodes (passfile=) or the configuration
//     an environment variable of theirs.
package node

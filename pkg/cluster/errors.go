package cluster

import (
	"errors"
	"sync/atomic"
)

// Errors of the cluster's nodes, coordinator and embedded etcd.
var (
	// ErrInvalidOptions is an options struct that does not validate.
	ErrInvalidOptions = errors.New("cluster: invalid options")
	// ErrEmbeddedEtcd is an embedded etcd member that did not start or serve.
	ErrEmbeddedEtcd = errors.New("cluster: embedded etcd")
	// ErrNodeExists is a node ID another live node holds.
	ErrNodeExists = errors.New("cluster: a live node holds this node ID")
	// ErrLeaseLost is a membership whose lease expired, was revoked, or
	// whose local deadline passed.
	ErrLeaseLost = errors.New("cluster: the node's lease is lost")
	// ErrNotCoordinator is a write of a node that is not (or no longer)
	// the coordinator.
	ErrNotCoordinator = errors.New("cluster: not the coordinator")
	// ErrBadName is a changefeed name that cannot be one.
	ErrBadName = errors.New("cluster: not a changefeed name")
	// ErrChangefeedExists is a create of a name taken.
	ErrChangefeedExists = errors.New("cluster: a changefeed of this name exists")
	// ErrNoChangefeed is a changefeed that does not exist.
	ErrNoChangefeed = errors.New("cluster: no such changefeed")
	// ErrNoNode is a node that is not live.
	ErrNoNode = errors.New("cluster: no such live node")
	// ErrConflict is a guarded write whose own conditions failed (a key
	// changed since it was read).
	ErrConflict = errors.New("cluster: the keys changed since they were read")
)

// testingKnobs are the package's test hooks, all in one place.
type testingKnobs struct {
	// dropKeepalives, while true, drops a member's every keepalive before
	// it is sent (a node cut off from etcd).
	dropKeepalives atomic.Bool
	// rounds, if set, is told of every coordinator round's decisions.
	rounds chan<- []Decision
}

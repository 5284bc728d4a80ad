package cluster

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Election. One node at a time is the coordinator: the candidate whose key
// under Keys.Election is the oldest (etcd's concurrency.Election), each
// key under its node's lease, so a coordinator whose lease is lost is
// deposed by etcd. Its key's create revision is the fencing token: every
// write it makes is a transaction guarded by that key still existing at
// that revision, so a deposed coordinator's late write fails
// (ErrNotCoordinator) however late it arrives.

// Leadership is a won election: the coordinator's right to write.
type Leadership struct {
	client   *clientv3.Client
	session  *concurrency.Session
	election *concurrency.Election
	key      string
	rev      int64
}

// Campaign waits until m's node is the coordinator (or ctx ends). Resign
// (or the membership's loss) ends the leadership.
func Campaign(ctx context.Context, m *Member) (*Leadership, error) {
	s, err := concurrency.NewSession(m.opts.Client, concurrency.WithLease(m.lease))
	if err != nil {
		return nil, fmt.Errorf("cluster: a session for the election: %w", err)
	}
	e := concurrency.NewElection(s, m.opts.Keys.Election())
	if err := e.Campaign(ctx, m.opts.NodeID); err != nil {
		s.Orphan() // the lease is the member's: Close would revoke it
		return nil, fmt.Errorf("cluster: campaign: %w", err)
	}
	return &Leadership{client: m.opts.Client, session: s, election: e, key: e.Key(), rev: e.Rev()}, nil
}

// Rev is the leadership's fencing token: its key's create revision,
// larger for each new coordinator.
func (l *Leadership) Rev() int64 { return l.rev }

// Txn commits ops if conds hold and this is still the coordinator:
// ErrNotCoordinator if it is not, ErrConflict if conds failed.
func (l *Leadership) Txn(ctx context.Context, conds []clientv3.Cmp, ops ...clientv3.Op) error {
	lead := clientv3.Compare(clientv3.CreateRevision(l.key), "=", l.rev)
	resp, err := l.client.Txn(ctx).If(append([]clientv3.Cmp{lead}, conds...)...).Then(ops...).
		Else(clientv3.OpGet(l.key)).Commit()
	if err != nil {
		return fmt.Errorf("cluster: a coordinator's write: %w", err)
	}
	if resp.Succeeded {
		return nil
	}
	if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 0 || kvs[0].CreateRevision != l.rev {
		return ErrNotCoordinator
	}
	return ErrConflict
}

// Resign gives the leadership up (another candidate wins at once).
func (l *Leadership) Resign(ctx context.Context) error {
	defer l.session.Orphan() // the lease is the member's
	if err := l.election.Resign(ctx); err != nil {
		return fmt.Errorf("cluster: resign: %w", err)
	}
	return nil
}

package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/testwait"
)

// The loss of one of three etcd members, the raft leader itself, loses no
// node's membership: the lease is kept alive through the others (a leader
// change only lengthens it), for two TTLs after the loss.
func TestOneOfThreeEtcdMembersLostLosesNoMembership(t *testing.T) {
	te := startEtcd(t, 3)
	c := te.client(t)
	ctx := context.Background()
	const ttl = 3 * time.Second
	m, err := StartMember(ctx, MemberOptions{Client: c, Keys: NewKeys("t"), NodeID: "n1", TTL: ttl})
	require.NoError(t, err)
	defer m.Close()
	leader := -1
	for i, e := range te.members {
		if e.Server.Leader() == e.Server.MemberID() {
			leader = i
		}
	}
	require.GreaterOrEqual(t, leader, 0, "a raft leader")
	te.stop(leader)
	lost := time.Now()
	testwait.Within(t, time.Minute, "keepalives acknowledged for two TTLs after the loss", func() bool {
		return m.Deadline().After(lost.Add(2 * ttl))
	})
	require.True(t, m.Valid())
	require.NoError(t, m.Err())
}

// Quorum lost (two of three members stopped): no keepalive is
// acknowledged, and every node's membership is lost at its local deadline,
// so none acts without a proof of its lease.
func TestQuorumLostEveryNodeSelfFences(t *testing.T) {
	te := startEtcd(t, 3)
	c := te.client(t)
	ctx := context.Background()
	const ttl = 3 * time.Second
	var ms []*Member
	for _, id := range []string{"n1", "n2"} {
		m, err := StartMember(ctx, MemberOptions{Client: c, Keys: NewKeys("t"), NodeID: id, TTL: ttl})
		require.NoError(t, err)
		defer m.Close()
		ms = append(ms, m)
	}
	te.stop(0)
	te.stop(1)
	for _, m := range ms {
		select {
		case <-m.Lost():
		case <-time.After(time.Minute):
			t.Fatal("a node kept its membership without a quorum")
		}
		require.ErrorIs(t, m.Err(), ErrLeaseLost)
		require.False(t, m.Valid())
	}
}

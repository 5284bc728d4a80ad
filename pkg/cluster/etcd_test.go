package cluster

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// testEtcd is a real etcd cluster of embedded members on loopback.
type testEtcd struct {
	members []*embed.Etcd
	stops   []func() // each stops its member, once
	urls    []string // the members' client URLs
}

// stop stops member i (a member lost).
func (te *testEtcd) stop(i int) { te.stops[i]() }

// startEtcd starts n embedded members (a cluster of n) in the test's
// directory; the test's cleanup stops them.
func startEtcd(t *testing.T, n int) *testEtcd {
	t.Helper()
	var ms []EmbeddedMember
	for i := range n {
		ms = append(ms, EmbeddedMember{Name: fmt.Sprintf("m%d", i), Dir: t.TempDir(),
			ClientURL: "http://" + freeAddr(t), PeerURL: "http://" + freeAddr(t)})
	}
	te := &testEtcd{}
	started := make(chan struct {
		e   *embed.Etcd
		err error
	}, n)
	for _, m := range ms { // together: each waits for a quorum
		go func() {
			e, err := StartEmbedded(context.Background(), EmbeddedOptions{Member: m, Cluster: ms, Token: t.Name(), ReadyTimeout: 2 * time.Minute})
			started <- struct {
				e   *embed.Etcd
				err error
			}{e, err}
		}()
		te.urls = append(te.urls, m.ClientURL)
	}
	for range n {
		r := <-started
		require.NoError(t, r.err)
		te.members = append(te.members, r.e)
		stop := sync.OnceFunc(r.e.Close) // a second Close panics
		te.stops = append(te.stops, stop)
		t.Cleanup(stop)
	}
	return te
}

// freeAddr is a loopback address free when chosen.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().String()
}

// client connects to every member; the test's cleanup closes it.
func (te *testEtcd) client(t *testing.T) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: te.urls, DialTimeout: 10 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// A node's local deadline passes before etcd expires its lease: with its
// keepalives held (a node frozen or cut off), the membership is lost, and
// Valid false, before the watch sees its key deleted. A second node under
// the same ID is refused while the first lives, and joins after.
func TestTheLocalDeadlinePassesBeforeTheLeaseExpires(t *testing.T) {
	te := startEtcd(t, 1)
	c := te.client(t)
	keys := NewKeys("t")
	ctx := context.Background()
	m, err := StartMember(ctx, MemberOptions{Client: c, Keys: keys, NodeID: "n1", Info: []byte(`{}`), TTL: 3 * time.Second})
	require.NoError(t, err)
	defer m.Close()
	require.True(t, m.Valid())
	_, err = StartMember(ctx, MemberOptions{Client: c, Keys: keys, NodeID: "n1", TTL: 3 * time.Second})
	require.ErrorIs(t, err, ErrNodeExists)

	w := c.Watch(ctx, keys.Node("n1"))
	m.knobs.dropKeepalives.Store(true) // no keepalive from now on
	var deleted time.Time
	for resp := range w {
		require.NoError(t, resp.Err())
		if len(resp.Events) > 0 && resp.Events[0].Type == clientv3.EventTypeDelete {
			deleted = time.Now()
			break
		}
	}
	require.False(t, m.Valid(), "still valid when etcd expired the lease")
	select {
	case <-m.Lost():
	default:
		t.Fatal("the membership is not lost when etcd expired the lease")
	}
	require.ErrorIs(t, m.Err(), ErrLeaseLost)
	require.True(t, m.Deadline().Before(deleted), "deadline %v, deleted %v", m.Deadline(), deleted)

	m2, err := StartMember(ctx, MemberOptions{Client: c, Keys: keys, NodeID: "n1", TTL: 3 * time.Second})
	require.NoError(t, err, "the ID is free once the lease expired")
	require.NoError(t, m2.Close())
}

// A deposed coordinator's late write fails: n1 wins and writes; its lease
// is revoked (as etcd expires a frozen node's), n2 wins, and n1's write,
// made after, is refused (ErrNotCoordinator) while n2's commits. A write
// whose own condition fails is ErrConflict, not a loss of leadership.
func TestADeposedCoordinatorsWriteFails(t *testing.T) {
	te := startEtcd(t, 1)
	c := te.client(t)
	keys := NewKeys("t")
	ctx := context.Background()
	m1, err := StartMember(ctx, MemberOptions{Client: c, Keys: keys, NodeID: "n1", TTL: 5 * time.Second})
	require.NoError(t, err)
	defer m1.Close()
	m2, err := StartMember(ctx, MemberOptions{Client: c, Keys: keys, NodeID: "n2", TTL: 5 * time.Second})
	require.NoError(t, err)
	defer m2.Close()
	l1, err := Campaign(ctx, m1)
	require.NoError(t, err)
	require.NoError(t, l1.Txn(ctx, nil, clientv3.OpPut(keys.Assignment("cf"), "n1")))
	require.ErrorIs(t, l1.Txn(ctx, []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(keys.Assignment("cf")), "=", 0)},
		clientv3.OpPut(keys.Assignment("cf"), "n1 again")), ErrConflict)

	won := make(chan *Leadership, 1)
	go func() {
		l2, err := Campaign(ctx, m2)
		if err != nil {
			t.Error(err)
		}
		won <- l2
	}()
	_, err = c.Revoke(ctx, m1.Lease())
	require.NoError(t, err)
	l2 := <-won
	require.NotNil(t, l2)
	require.Greater(t, l2.Rev(), l1.Rev(), "the fencing token grows")
	require.ErrorIs(t, l1.Txn(ctx, nil, clientv3.OpPut(keys.Assignment("cf"), "n1 late")), ErrNotCoordinator)
	require.NoError(t, l2.Txn(ctx, nil, clientv3.OpPut(keys.Assignment("cf"), "n2")))
	got, err := c.Get(ctx, keys.Assignment("cf"))
	require.NoError(t, err)
	require.Equal(t, "n2", string(got.Kvs[0].Value))
	require.NoError(t, l2.Resign(ctx))
	testwaitLost(t, m1)
}

// testwaitLost waits for m's membership to be lost (its lease revoked:
// the next keepalive says so).
func testwaitLost(t *testing.T, m *Member) {
	t.Helper()
	select {
	case <-m.Lost():
		require.True(t, strings.Contains(m.Err().Error(), "no longer has lease") || strings.Contains(m.Err().Error(), "local deadline"), m.Err().Error())
	case <-time.After(time.Minute):
		t.Fatal("the membership of a revoked lease is not lost")
	}
}

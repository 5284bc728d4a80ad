package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/clock"
)

// The coordinator's loop over a real etcd: changefeeds created are placed
// over both nodes; the other node's lease revoked (as etcd expires a dead
// node's), its changefeeds move to the coordinator's node; one paused is
// taken off its node; one removed loses its assignment. The loop ends when
// its context does, resigning.
func TestTheCoordinatorPlacesAndMovesChangefeeds(t *testing.T) {
	te := startEtcd(t, 1)
	c := te.client(t)
	keys := NewKeys("t")
	ctx := context.Background()
	join := func(id string) *Member {
		info, _ := json.Marshal(NodeInfo{Addr: id + ":8080"})
		m, err := StartMember(ctx, MemberOptions{Client: c, Keys: keys, NodeID: id, Info: info, TTL: 5 * time.Second})
		require.NoError(t, err)
		return m
	}
	n1, n2 := join("n1"), join("n2")
	defer n1.Close()
	defer n2.Close()
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	co, err := NewCoordinator(CoordinatorOptions{Member: n1, BalanceInterval: time.Hour})
	require.NoError(t, err)
	go func() { done <- co.Run(runCtx) }()
	spec := func(name, state string) {
		b, _ := json.Marshal(Spec{State: state, Config: json.RawMessage(`{}`)})
		_, err := c.Put(ctx, keys.Spec(name), string(b))
		require.NoError(t, err)
	}
	assignments := func() map[string]string {
		resp, err := c.Get(ctx, keys.Changefeeds(), clientv3.WithPrefix())
		require.NoError(t, err)
		out := map[string]string{}
		for _, kv := range resp.Kvs {
			if name, what := keys.changefeedKey(string(kv.Key)); what == "assign" {
				var a Assignment
				require.NoError(t, json.Unmarshal(kv.Value, &a))
				if a.Node != "" {
					out[name] = a.Node
				}
			}
		}
		return out
	}
	for k := 1; k <= 4; k++ {
		spec(fmt.Sprintf("cf%d", k), StateRunning)
	}
	testwait.Within(t, time.Minute, "four changefeeds placed over both nodes", func() bool {
		a := assignments()
		per := map[string]int{}
		for _, n := range a {
			per[n]++
		}
		return len(a) == 4 && per["n1"] == 2 && per["n2"] == 2
	})
	_, err = c.Revoke(ctx, n2.Lease())
	require.NoError(t, err)
	testwait.Within(t, time.Minute, "n2's changefeeds on n1", func() bool {
		a := assignments()
		return len(a) == 4 && a["cf1"] == "n1" && a["cf2"] == "n1" && a["cf3"] == "n1" && a["cf4"] == "n1"
	})
	spec("cf1", StatePaused)
	_, err = c.Delete(ctx, keys.Spec("cf2"))
	require.NoError(t, err)
	testwait.Within(t, time.Minute, "cf1 paused and cf2 removed: on no node", func() bool {
		a := assignments()
		_, one := a["cf1"]
		_, two := a["cf2"]
		return len(a) == 2 && !one && !two
	})
	stop()
	require.NoError(t, <-done)
	resp, err := c.Get(ctx, keys.Election(), clientv3.WithPrefix())
	require.NoError(t, err)
	require.Empty(t, resp.Kvs, "resigned")
}

// A node that joins takes changefeeds only at the balance rounds, at most
// MaxBalanceMoves each: the rounds its joining wakes move nothing, the
// first timed round moves one changefeed, the next another.
func TestANodeThatJoinsTakesChangefeedsAFewAtATime(t *testing.T) {
	te := startEtcd(t, 1)
	c := te.client(t)
	keys := NewKeys("t")
	ctx := context.Background()
	join := func(id string) *Member {
		info, _ := json.Marshal(NodeInfo{Addr: id + ":8080"})
		m, err := StartMember(ctx, MemberOptions{Client: c, Keys: keys, NodeID: id, Info: info, TTL: 5 * time.Second})
		require.NoError(t, err)
		return m
	}
	n1 := join("n1")
	defer n1.Close()
	fake := clock.NewFake(time.Unix(0, 0))
	rounds := make(chan []Decision)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	co, err := NewCoordinator(CoordinatorOptions{Member: n1, BalanceInterval: time.Minute, MaxBalanceMoves: 1, Clock: fake})
	require.NoError(t, err)
	co.knobs.rounds = rounds
	go func() { done <- co.Run(runCtx) }()
	<-rounds // the first, before any changefeed
	for k := 1; k <= 4; k++ {
		b, _ := json.Marshal(Spec{State: StateRunning, Config: json.RawMessage(`{}`)})
		_, err := c.Put(ctx, keys.Spec(fmt.Sprintf("cf%d", k)), string(b))
		require.NoError(t, err)
	}
	placed := 0
	for placed < 4 {
		for _, d := range <-rounds {
			require.Equal(t, Decision{Changefeed: d.Changefeed, To: "n1", Why: ReasonNewNode}, d)
			placed++
		}
	}
	n2 := join("n2")
	defer n2.Close()
	require.NoError(t, fake.WaitWaiters(ctx, 1)) // the balance ticker
	next := func() []Decision {
		for {
			if ds := <-rounds; len(ds) > 0 {
				return ds
			}
		}
	}
	fake.Advance(time.Minute)
	require.Equal(t, []Decision{{Changefeed: "cf1", From: "n1", To: "n2", Why: ReasonBalance}}, next())
	fake.Advance(time.Minute)
	require.Equal(t, []Decision{{Changefeed: "cf2", From: "n1", To: "n2", Why: ReasonBalance}}, next())
	stop()
	go func() { // rounds in flight at the stop
		for range rounds {
		}
	}()
	require.NoError(t, <-done)
	close(rounds)
}

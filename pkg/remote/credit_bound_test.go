package remote

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/internal/testwait"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// Tests of the credit a collector grants, against raw streams that grant
// what a Client never would (the edge under test is the server's
// accounting of the grants it reads).

// oneResolved is a message of weight one.
func oneResolved(i int) []messaging.Message {
	return []messaging.Message{&messaging.Resolved{Header: hdr(uint64(i + 1)), Ts: common.Ts(i + 1)}}
}

// awaitRoom waits until room is closed: the server has read and applied
// the grant that makes it so.
func awaitRoom(t *testing.T, room <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-room:
	case <-time.After(30 * time.Second): // a deadline for a failing test, not ordering
		t.Fatalf("no room: %s", what)
	}
}

// creditOf reads the credit the server holds for p.
func creditOf(p *peer) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mu.credit
}

// A peer cannot inflate its credit: a grant beyond the capacity it
// announced (2^30, then the largest grant the wire carries) leaves the
// credit at that capacity, so a collector that stops reading can have at
// most capacity messages queued for it. Interleaving: hello (capacity 4,
// credit 1), then a grant of 2^30 applied (the server wakes a waiting
// sender: the credit reached half the capacity); the collector reads
// nothing; four one-message Sends are accepted and the fifth is ErrBusy.
// Again from no credit with a grant of 2^32-1.
func TestAGrantBeyondTheCapacityLeavesTheCreditAtTheCapacity(t *testing.T) {
	srv, addr, _ := serve(t, ServerOptions{})
	st, _ := rawStream(t, rawConn(t, addr), appendHello(nil, "c1", 4, 1))
	waitConnected(t, srv, "c1")

	for round, grant := range []uint32{1 << 30, math.MaxUint32} {
		require.False(t, srv.HasRoom("c1"), "round %d: less than half the capacity is left", round)
		room := srv.Room("c1")
		require.NoError(t, st.SendMsg(&frame{b: appendCredit(nil, grant)}))
		awaitRoom(t, room, "the grant was applied")
		for i := range 4 {
			require.NoError(t, srv.Send("c1", oneResolved(i)), "round %d: message %d is within the capacity", round, i+1)
		}
		require.ErrorIs(t, srv.Send("c1", oneResolved(4)), messaging.ErrBusy,
			"round %d: a grant of %d still leaves the credit at the capacity (4)", round, grant)
	}
}

// A sender waiting for room (messaging.RoomNotifier) is woken only once
// the collector has granted back at least half its capacity: a grant that
// leaves the credit below half neither closes the Room channel nor makes
// HasRoom true; the grant that reaches exactly half does both.
// Interleaving: hello (capacity 8, credit 0); the sender takes the Room
// channel; the collector grants 3 (applied: the credit is 3, 2*3 < 8),
// then 1 (credit 4, 2*4 >= 8).
func TestASenderWaitingForRoomIsWokenOnlyAtHalfTheCapacity(t *testing.T) {
	srv, addr, _ := serve(t, ServerOptions{})
	st, _ := rawStream(t, rawConn(t, addr), appendHello(nil, "c1", 8, 0))
	waitConnected(t, srv, "c1")
	srv.mu.Lock()
	p := srv.mu.peers["c1"]
	srv.mu.Unlock()

	room := srv.Room("c1")
	require.False(t, srv.HasRoom("c1"))
	require.NoError(t, st.SendMsg(&frame{b: appendCredit(nil, 3)}))
	testwait.For(t, "the grant of 3 was applied", func() bool { return creditOf(p) == 3 })
	select {
	case <-room:
		t.Fatal("woken by a credit of 3 of a capacity of 8: less than half")
	default:
	}
	require.False(t, srv.HasRoom("c1"), "a credit of 3 of 8 is not room")

	require.NoError(t, st.SendMsg(&frame{b: appendCredit(nil, 1)}))
	awaitRoom(t, room, "a credit of 4 of 8 is half the capacity")
	require.True(t, srv.HasRoom("c1"))
	require.Equal(t, 4, creditOf(p))
}

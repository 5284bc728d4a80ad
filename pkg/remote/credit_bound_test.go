package remote

import (
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	"github.com/cdcflow/eventservice/internal/promutil"
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
	return int(p.mu.credit.available())
}

// peerOf is target's stream as the server holds it.
func peerOf(srv *Server, target messaging.Target) *peer {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return srv.mu.peers[target]
}

// readFrames reads data frames from a raw stream until it has read
// weight messages, and returns the mark of the last one.
func readFrames(t *testing.T, st grpc.ClientStream, weight int) mark {
	t.Helper()
	var last mark
	for weight > 0 {
		var f frame
		require.NoError(t, st.RecvMsg(&f))
		m, msgs, err := decodeDataFrame(f.b)
		require.NoError(t, err)
		if len(msgs) > 0 {
			weight -= messaging.WeightOf(msgs)
			last = m
		}
	}
	return last
}

// grantsApplied returns knobs counting the credit frames the server has
// applied, and a wait for the count to reach n.
func grantsApplied() (testingKnobs, func(t *testing.T, n int64)) {
	var applied atomic.Int64
	knobs := testingKnobs{granted: func() { applied.Add(1) }}
	return knobs, func(t *testing.T, n int64) {
		t.Helper()
		testwait.For(t, "the server applied the grants", func() bool { return applied.Load() >= n })
	}
}

// A peer cannot inflate its credit: a grant beyond the capacity it
// announced (2^30, then the largest grant the wire carries) leaves the
// credit at that capacity, so a collector that stops reading can have at
// most capacity messages queued for it. Interleaving: hello (capacity 4,
// credit 1), then a grant of 2^30 applied (the server wakes a waiting
// sender: the credit reached half the capacity); the collector reads
// nothing; four one-message Sends are accepted and the fifth is ErrBusy.
// Again with a grant of 2^32-1 that echoes the mark of the four, read.
func TestAGrantBeyondTheCapacityLeavesTheCreditAtTheCapacity(t *testing.T) {
	srv, addr, _ := serve(t, ServerOptions{})
	st, _ := rawStream(t, rawConn(t, addr), appendHello(nil, "c1", 4, 1))
	waitConnected(t, srv, "c1")

	var read mark
	for round, grant := range []uint32{1 << 30, math.MaxUint32} {
		require.False(t, srv.HasRoom("c1"), "round %d: less than half the capacity is left", round)
		room := srv.Room("c1")
		if round > 0 {
			read = readFrames(t, st, 4)
		}
		require.NoError(t, st.SendMsg(&frame{b: appendCredit(nil, grant, read)}))
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
	require.NoError(t, st.SendMsg(&frame{b: appendCredit(nil, 3, mark{})}))
	testwait.For(t, "the grant of 3 was applied", func() bool { return creditOf(p) == 3 })
	select {
	case <-room:
		t.Fatal("woken by a credit of 3 of a capacity of 8: less than half")
	default:
	}
	require.False(t, srv.HasRoom("c1"), "a credit of 3 of 8 is not room")

	require.NoError(t, st.SendMsg(&frame{b: appendCredit(nil, 1, mark{})}))
	awaitRoom(t, room, "a credit of 4 of 8 is half the capacity")
	require.True(t, srv.HasRoom("c1"))
	require.Equal(t, 4, creditOf(p))
}

// Credit is tied to what the peer read: a peer that grants credit but
// never reads gets no more than its capacity accepted, however much it
// grants, and the in-flight the server reports stays at most the
// capacity; once it reads, the mark it echoes frees what it read. (It
// once had 5,095 accepted against 4,096, until the send stall was
// declared.) Interleaving: hello (capacity 8, credit 8); eight Sends
// accepted, the ninth ErrBusy; a grant of 8 echoing no mark, applied
// (the knob counts it); still ErrBusy and no room, four rounds; then the
// peer reads the eight and echoes the last frame's mark with no grant:
// room, and eight more are accepted (the grants it made are believed up
// to the capacity beyond what it read).
func TestAPeerThatGrantsWithoutReadingGetsNoMoreThanItsCapacity(t *testing.T) {
	const capacity = 8
	reg := prometheus.NewRegistry()
	knobs, waitGrants := grantsApplied()
	srv, addr, _ := serveWithKnobs(t, ServerOptions{Registerer: reg}, knobs)
	st, _ := rawStream(t, rawConn(t, addr), appendHello(nil, "c1", capacity, capacity))
	waitConnected(t, srv, "c1")
	inFlight := func() float64 {
		v, _, err := promutil.Sum(reg, "cdcflow_remote_server_in_flight_messages")
		require.NoError(t, err)
		return v
	}

	accepted := 0
	for round := range 4 {
		for srv.Send("c1", oneResolved(accepted)) == nil {
			accepted++
		}
		require.Equal(t, capacity, accepted, "round %d: accepted for a peer that read nothing", round)
		require.LessOrEqual(t, inFlight(), float64(capacity))
		require.NoError(t, st.SendMsg(&frame{b: appendCredit(nil, capacity, mark{})})) // never reads
		waitGrants(t, int64(round+1))
		require.False(t, srv.HasRoom("c1"), "round %d: a grant without reading is no room", round)
	}
	require.ErrorIs(t, srv.Send("c1", oneResolved(accepted)), messaging.ErrBusy)

	room := srv.Room("c1")
	require.NoError(t, st.SendMsg(&frame{b: appendCredit(nil, 0, readFrames(t, st, capacity))}))
	awaitRoom(t, room, "the mark of the eight, read")
	for srv.Send("c1", oneResolved(accepted)) == nil {
		accepted++
	}
	require.Equal(t, 2*capacity, accepted, "eight more once eight were read")
	require.Equal(t, float64(capacity), inFlight())
}

// A mark the server did not send (a guessed tag, or a weight beyond what
// was sent) ends the stream as malformed: Sends fail with ErrUnavailable.
func TestAForgedMarkEndsTheStream(t *testing.T) {
	for name, forged := range map[string]func(key mark) mark{
		"guessed tag": func(m mark) mark { return mark{weight: m.weight, tag: m.tag ^ 1} },
		"beyond sent": func(m mark) mark { return mark{weight: m.weight + 1, tag: m.tag} },
		"zero weight": func(m mark) mark { return mark{tag: m.tag} },
	} {
		t.Run(name, func(t *testing.T) {
			srv, addr, _ := serve(t, ServerOptions{})
			st, _ := rawStream(t, rawConn(t, addr), appendHello(nil, "c1", 4, 4))
			waitConnected(t, srv, "c1")
			require.NoError(t, srv.Send("c1", oneResolved(0)))
			m := readFrames(t, st, 1)
			require.NoError(t, st.SendMsg(&frame{b: appendCredit(nil, 1, forged(m))}))
			testwait.For(t, "the stream ended", func() bool { return srv.Connected() == 0 })
			require.ErrorIs(t, srv.Send("c1", oneResolved(1)), messaging.ErrUnavailable)
		})
	}
}

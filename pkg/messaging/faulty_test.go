package messaging

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNewFaultyOptions(t *testing.T) {
	p, _ := newTransport(t, InProcessOptions{})
	for name, opts := range map[string]FaultOptions{
		"negative":  {RefuseRate: -0.1},
		"above one": {FailRate: 1.5},
		"NaN":       {DropRate: math.NaN()},
		"sum":       {RefuseRate: 0.5, FailRate: 0.3, DropRate: 0.3},
	} {
		_, err := NewFaulty(p, opts)
		require.ErrorIs(t, err, ErrInvalidOptions, name)
	}
	_, err := NewFaulty(nil, FaultOptions{})
	require.ErrorIs(t, err, ErrInvalidOptions)
	_, err = NewFaulty((*InProcess)(nil), FaultOptions{})
	require.ErrorIs(t, err, ErrInvalidOptions, "a typed nil inner transport")
	_, err = NewFaulty(p, FaultOptions{RefuseRate: 0.5, FailRate: 0.5})
	require.NoError(t, err, "rates may sum to exactly 1")
}

type outcome uint8

const (
	outForwarded outcome = iota
	outRefused
	outFailed
	outDropped
)

// runFaulty sends calls batches of two messages through a fresh Faulty over
// a fresh in-process target and returns each call's observable outcome
// (dropped and forwarded both return nil; they are told apart by what
// arrived), the stats and the seqs received.
func runFaulty(t *testing.T, seed uint64, calls int) ([]outcome, FaultStats, []uint64) {
	t.Helper()
	p, ins := newTransport(t, InProcessOptions{Capacity: 2 * calls}, "a")
	f, err := NewFaulty(p, FaultOptions{Seed: seed, RefuseRate: 0.1, FailRate: 0.2, DropRate: 0.3})
	require.NoError(t, err)
	outcomes := make([]outcome, calls)
	for i := range calls {
		before := ins[0].Len()
		err := f.Send("a", resN(uint64(2*i+1), 2))
		switch {
		case err == nil && ins[0].Len() == before+2:
			outcomes[i] = outForwarded
		case err == nil && ins[0].Len() == before:
			outcomes[i] = outDropped
		case err == ErrBusy:
			outcomes[i] = outRefused
		default:
			require.ErrorIs(t, err, ErrSendFailed)
			outcomes[i] = outFailed
		}
		require.Contains(t, []int{before, before + 2}, ins[0].Len(), "all or nothing")
	}
	return outcomes, f.Stats(), seqs(ins[0].Drain(nil, 0))
}

func TestFaultyIsReproducibleAndCounts(t *testing.T) {
	const (
		seed  = 42
		calls = 1000
	)
	outcomes, stats, got := runFaulty(t, seed, calls)

	// Replay the documented decision rule on the same source: one draw per
	// Send, thresholds 0.1 / 0.3 / 0.6.
	rng := rand.New(rand.NewPCG(seed, 0))
	var want FaultStats
	var wantSeqs []uint64
	for i := range calls {
		var o outcome
		switch u := rng.Float64(); {
		case u < 0.1:
			o, want.Refused = outRefused, want.Refused+1
		case u < 0.3:
			o, want.Failed = outFailed, want.Failed+1
		case u < 0.6:
			o, want.Dropped, want.DroppedMessages = outDropped, want.Dropped+1, want.DroppedMessages+2
		default:
			o, want.Forwarded = outForwarded, want.Forwarded+1
			wantSeqs = append(wantSeqs, uint64(2*i+1), uint64(2*i+2))
		}
		want.Sends++
		require.Equal(t, o, outcomes[i], "call %d", i)
	}
	require.Equal(t, want, stats)
	require.Equal(t, wantSeqs, got, "forwarded batches arrive in order; the rest leave gaps")
	require.Equal(t, stats.Sends, stats.Refused+stats.Failed+stats.Dropped+stats.Forwarded)
	// The rates are honoured roughly (exactly, for this seed, as replayed above).
	require.InDelta(t, 100, stats.Refused, 35)
	require.InDelta(t, 200, stats.Failed, 45)
	require.InDelta(t, 300, stats.Dropped, 50)

	again, stats2, got2 := runFaulty(t, seed, calls)
	require.Equal(t, outcomes, again)
	require.Equal(t, stats, stats2)
	require.Equal(t, got, got2)

	other, _, _ := runFaulty(t, seed+1, calls)
	require.NotEqual(t, outcomes, other, "another seed, another run")
}

func TestFaultyPassesInnerErrorsThrough(t *testing.T) {
	p, _ := newTransport(t, InProcessOptions{Capacity: 1}, "a")
	f, err := NewFaulty(p, FaultOptions{})
	require.NoError(t, err)
	require.NoError(t, f.Send("a", resN(1, 1)))
	require.ErrorIs(t, f.Send("a", resN(2, 1)), ErrBusy)
	require.ErrorIs(t, f.Send("b", resN(2, 1)), ErrUnknownTarget)
	require.Equal(t, FaultStats{Sends: 3, Forwarded: 3}, f.Stats())
}

func TestFaultyDelayBlocksSend(t *testing.T) {
	p, ins := newTransport(t, InProcessOptions{}, "a")
	entered := make(chan []Message, 1)
	release := make(chan struct{})
	f, err := NewFaulty(p, FaultOptions{Delay: func(target Target, msgs []Message) {
		assert.Equal(t, Target("a"), target) // not require: this runs off the test goroutine
		entered <- msgs
		<-release
	}})
	require.NoError(t, err)

	sent := make(chan error, 1)
	go func() { sent <- f.Send("a", resN(1, 3)) }()
	require.Equal(t, []uint64{1, 2, 3}, seqs(<-entered))
	// Held in Delay: nothing decided, nothing delivered.
	require.Zero(t, f.Stats().Sends)
	require.Zero(t, ins[0].Len())
	require.False(t, rung(ins[0]))

	close(release)
	require.NoError(t, <-sent)
	require.Equal(t, 3, ins[0].Len())
	require.Equal(t, FaultStats{Sends: 1, Forwarded: 1}, f.Stats())
}

// sendOnlyForFaultyTest is a Transport without a room signal (the edge
// this test is about).
type sendOnlyForFaultyTest struct{}

func (sendOnlyForFaultyTest) Send(Target, []Message) error { return ErrBusy }

// TestFaultyAnswersRoomAsItsInnerTransport: Room and HasRoom are the inner
// transport's; over one without the signal there is always room (its
// refusals, like injected ones, are not a full queue to wait out).
func TestFaultyAnswersRoomAsItsInnerTransport(t *testing.T) {
	p, _ := newTransport(t, InProcessOptions{Capacity: 2}, "a")
	f, err := NewFaulty(p, FaultOptions{})
	require.NoError(t, err)
	require.True(t, f.HasRoom("a"))
	require.NoError(t, f.Send("a", resN(1, 2)))
	require.False(t, f.HasRoom("a"), "the inner inbox is full")
	select {
	case <-f.Room("a"):
		t.Fatal("Room closed while the inner inbox is full")
	default:
	}

	bare, err := NewFaulty(sendOnlyForFaultyTest{}, FaultOptions{})
	require.NoError(t, err)
	require.True(t, bare.HasRoom("a"))
	<-bare.Room("a") // closed at once
}

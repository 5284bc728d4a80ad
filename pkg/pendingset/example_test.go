package pendingset_test

import (
	"context"
	"fmt"
	"time"

	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/pendingset"
)

// Example reproduces seed 001's scenario on a fake sink that takes 4 ms per
// round trip: writers update 1,000 actions (one in four updates hits one
// hot action) at 5,000 updates/s for 2 s. Pumping one payload per round
// trip tops out at 250 updates/s, so the demand takes 40 s to clear (and a
// 256-slot channel in front of it would block the writers); the pending set
// clears it as it arrives, and no action's last update is lost.
//
// Time is virtual, so the output is exact: the sink advances a fake clock
// by one round trip per call, and the writers' updates for that interval
// are made from inside the call.
func Example() {
	const (
		actions   = 1_000
		perTrip   = 20 // updates per 4 ms round trip: 5,000/s
		trips     = 500
		roundTrip = 4 * time.Millisecond
	)
	start := time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)

	// The writers' schedule: update n goes to the hot action 0 when n%4==0,
	// else to one of the 999 others in a fixed pseudo-random order.
	updates := make([]dispatcherID, 0, perTrip*trips)
	for n := range perTrip * trips {
		id := dispatcherID{Lo: 0}
		if n%4 != 0 {
			id.Lo = 1 + uint64(n*7919%(actions-1))
		}
		updates = append(updates, id)
	}

	// One at a time: each round trip carries one payload, as Flyte's FIFO
	// pump does; the FIFO is unbounded here so the writers never wait.
	var fifo []dispatcherID
	fifoTrips := 0
	for next := 0; next < len(updates) || len(fifo) > 0; fifoTrips++ {
		if next < len(updates) { // demand arriving during this round trip
			fifo = append(fifo, updates[next:next+perTrip]...)
			next += perTrip
		}
		fifo = fifo[1:] // deliver one payload
	}
	fifoElapsed := time.Duration(fifoTrips) * roundTrip
	fifoRate := float64(len(updates)) / fifoElapsed.Seconds()

	// The pending set, pumped in batches, against the same sink.
	clk := clock.NewFake(start)
	set, err := pendingset.New(pendingset.Options[dispatcherID, resolved]{Merge: newer, Clock: clk})
	if err != nil {
		panic(err)
	}
	lastAdded := map[dispatcherID]uint64{}
	next := 0
	write := func() { // one round trip's worth of updates
		for _, id := range updates[next : next+perTrip] {
			next++
			set.Add(id, resolved{Epoch: 1, Seq: uint64(next), ResolvedTs: uint64(next)})
			lastAdded[id] = uint64(next)
		}
	}
	lastDelivered := map[dispatcherID]uint64{}
	setTrips := 0
	pump, err := pendingset.NewPump(set, func(_ context.Context, batch []pendingset.Entry[dispatcherID, resolved]) error {
		setTrips++
		clk.Advance(roundTrip)
		for _, e := range batch {
			lastDelivered[e.Key] = e.Value.Seq
		}
		if next < len(updates) {
			write()
		}
		return nil
	})
	if err != nil {
		panic(err)
	}
	write()
	if err := pump.Start(); err != nil {
		panic(err)
	}
	if err := pump.Drain(context.Background()); err != nil {
		panic(err)
	}
	setElapsed := clk.Now().Sub(start)
	setRate := float64(len(updates)) / setElapsed.Seconds()

	lost := 0
	for id, seq := range lastAdded {
		if lastDelivered[id] != seq {
			lost++
		}
	}
	st := set.Stats()
	fmt.Printf("demand: %d updates to %d actions in %v\n", len(updates), len(lastAdded), time.Duration(trips)*roundTrip)
	fmt.Printf("one at a time: %d round trips, %v, %.0f updates/s\n", fifoTrips, fifoElapsed, fifoRate)
	fmt.Printf("pending set: %d round trips, %v, %.0f updates/s, %d keys delivered, %d adds coalesced\n",
		setTrips, setElapsed, setRate, st.Delivered, st.Coalesced)
	fmt.Println("lost:", lost)
	fmt.Println("batched faster than one-at-a-time:", setRate > fifoRate)
	// Output:
	// demand: 10000 updates to 1000 actions in 2s
	// one at a time: 10000 round trips, 40s, 250 updates/s
	// pending set: 500 round trips, 2s, 5000 updates/s, 8000 keys delivered, 2000 adds coalesced
	// lost: 0
	// batched faster than one-at-a-time: true
}

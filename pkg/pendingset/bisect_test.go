package pendingset

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// refusingTargetForTest fails a whole batch with failure whenever it holds
// the bad key, like a pg_notify statement with one payload over the 8000
// byte limit, and records the keys of the batches it accepts.
type refusingTargetForTest struct {
	bad     int
	failure func(call int) error
	mu      sync.Mutex
	calls   int
	got     []int
}

func (r *refusingTargetForTest) deliver(_ context.Context, batch []Entry[int, uint64]) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	for _, e := range batch {
		if e.Key == r.bad {
			return r.failure(r.calls)
		}
	}
	for _, e := range batch {
		r.got = append(r.got, e.Key)
	}
	return nil
}

// TestPermanentBatchFailureIsolatesTheBadKey: one bad key among 2,000
// fails its whole batch permanently; the pump bisects instead of retrying
// the batch forever: every other key is delivered exactly once, the bad one
// is quarantined and reported, and Drain returns.
func TestPermanentBatchFailureIsolatesTheBadKey(t *testing.T) {
	s, _ := newTestSet(t, func(o *Options[int, uint64]) { o.MaxAttempts = 1 })
	target := &refusingTargetForTest{bad: 1234, failure: func(int) error {
		return Permanent(errors.New("payload string too long"))
	}}
	p, err := NewPump(s, target.deliver)
	require.NoError(t, err)
	for k := range 2000 {
		s.Add(k, 1)
	}
	require.NoError(t, p.Start())
	// Bounded, so that a pump wedged by the bad key fails the test.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.ErrorIs(t, p.Drain(ctx), ErrQuarantined)

	want := slices.DeleteFunc(seq(2000), func(k int) bool { return k == 1234 })
	got := slices.Clone(target.got)
	slices.Sort(got)
	require.Equal(t, want, got, "every other key delivered, each once")
	require.Equal(t, []int{1234}, s.QuarantinedKeys(nil))
	st := s.Stats()
	require.Equal(t, uint64(1), st.KeyFailures)
	// 4 batches of 512; the bad one costs 2 deliveries per level of a
	// 512-entry bisection (9 levels), not one per key.
	require.LessOrEqual(t, target.calls, 4+2*9)
	require.Equal(t, uint64(9), st.Bisections)
}

// TestRepeatedBatchFailureIsBisectedWithoutSpendingBudget: a transient
// whole-batch failure that repeats BisectAfter times is bisected too; the
// key that keeps failing alone is retried later without spending budget
// (an outage must not quarantine), and the others are delivered.
func TestRepeatedBatchFailureIsBisectedWithoutSpendingBudget(t *testing.T) {
	s, clk := newTestSet(t, func(o *Options[int, uint64]) { o.BisectAfter = 2 })
	target := &refusingTargetForTest{bad: 7, failure: func(int) error { return errors.New("connection reset") }}
	p, err := NewPump(s, target.deliver)
	require.NoError(t, err)
	for k := range 16 {
		s.Add(k, 1)
	}
	require.NoError(t, p.Start())
	t.Cleanup(p.Stop)
	// First failure: the whole batch backs off. Second: bisected.
	require.NoError(t, clk.WaitWaiters(context.Background(), 1))
	clk.Advance(DefaultBackoffBase)
	require.NoError(t, clk.WaitWaiters(context.Background(), 1)) // key 7's own backoff
	target.mu.Lock()
	got := slices.Clone(target.got)
	target.mu.Unlock()
	slices.Sort(got)
	require.Equal(t, slices.DeleteFunc(seq(16), func(k int) bool { return k == 7 }), got)
	st := s.Stats()
	require.Zero(t, st.KeyFailures, "no budget spent")
	require.Positive(t, st.KeyRetries)
	require.Equal(t, 1, s.Len())
	require.Empty(t, s.QuarantinedKeys(nil))
}

// TestBusyTargetIsNeverBisected: routine back-pressure (ErrBusy) repeats
// as long as the target is full; splitting the batch would not help, so
// the batch is retried whole.
func TestBusyTargetIsNeverBisected(t *testing.T) {
	s, clk := newTestSet(t, func(o *Options[int, uint64]) { o.BisectAfter = 2 })
	target := &refusingTargetForTest{bad: -1}
	busy := 3
	deliver := func(ctx context.Context, batch []Entry[int, uint64]) error {
		if busy > 0 {
			busy--
			return ErrBusy
		}
		return target.deliver(ctx, batch)
	}
	p, err := NewPump(s, deliver)
	require.NoError(t, err)
	for k := range 16 {
		s.Add(k, 1)
	}
	require.NoError(t, p.Start())
	for range 3 {
		require.NoError(t, clk.WaitWaiters(context.Background(), 1))
		due, _ := clk.NextDue()
		clk.Advance(due)
	}
	require.NoError(t, p.Drain(context.Background()))
	require.Zero(t, s.Stats().Bisections)
	require.Equal(t, 1, target.calls, "one whole batch once the target had room")
	require.Len(t, target.got, 16)
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// TestDrainBoundedByBytes: with Size and MaxBatchBytes a batch stops before
// the entry that would take it over the byte bound (one oversized entry
// still goes, alone), and the count bound still applies.
func TestDrainBoundedByBytes(t *testing.T) {
	s, _ := newTestSet(t, func(o *Options[int, uint64]) {
		o.Size = func(_ int, v uint64) int { return int(v) }
		o.MaxBatchBytes = 1000
		o.MaxBatch = 3
		o.Merge = func(_, v uint64) uint64 { return v }
	})
	sizes := []uint64{300, 300, 300, 900, 100, 5000, 10, 10, 10, 10}
	for k, v := range sizes {
		s.Add(k, v)
	}
	var batches [][]int
	for {
		b := s.Drain(0, nil)
		if len(b) == 0 {
			break
		}
		batches = append(batches, keysOf(b))
		require.NoError(t, s.Complete(b, nil))
	}
	require.Equal(t, [][]int{{0, 1, 2}, {3, 4}, {5}, {6, 7, 8}, {9}}, batches)

	_, err := New(Options[int, uint64]{Merge: maxMerge, MaxBatchBytes: 10})
	require.ErrorIs(t, err, ErrInvalidOptions, "MaxBatchBytes without Size")
	_, err = New(Options[int, uint64]{Merge: maxMerge, Size: func(int, uint64) int { return 1 }})
	require.ErrorIs(t, err, ErrInvalidOptions, "Size without MaxBatchBytes")
}

// TestDeliveryTimeoutFailsTheBatchAsAWhole: a delivery that hangs past
// DeliveryTimeout (on the set's clock) is cancelled; the error wraps
// ErrDeliveryTimeout, the batch merges back, and the retry delivers it.
func TestDeliveryTimeoutFailsTheBatchAsAWhole(t *testing.T) {
	const timeout = 5 * time.Second
	s, clk := newTestSet(t, func(o *Options[int, uint64]) { o.DeliveryTimeout = timeout })
	var calls int
	var mu sync.Mutex
	var got []int
	deliver := func(ctx context.Context, batch []Entry[int, uint64]) error {
		mu.Lock()
		calls++
		first := calls == 1
		mu.Unlock()
		if first {
			<-ctx.Done() // a target that never answers
			return ctx.Err()
		}
		mu.Lock()
		defer mu.Unlock()
		got = append(got, keysOf(batch)...)
		return nil
	}
	p, err := NewPump(s, deliver)
	require.NoError(t, err)

	// The deadline on its own, through the pump's delivery call.
	s.Add(1, 1)
	s.Add(2, 1)
	batch := s.Drain(0, nil)
	errc := make(chan error, 1)
	go func() { errc <- p.deliverOnce(context.Background(), batch) }()
	wctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, clk.WaitWaiters(wctx, 1), "the delivery arms a deadline timer")
	clk.Advance(timeout)
	err = <-errc
	require.ErrorIs(t, err, ErrDeliveryTimeout)
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, s.Complete(batch, err))
	require.Equal(t, uint64(1), s.Stats().BatchFailures)

	// The retry, through the running pump, delivers both keys.
	require.NoError(t, p.Start())
	require.NoError(t, p.Drain(context.Background()))
	require.ElementsMatch(t, []int{1, 2}, got)
}

// TestSeveralBatchesInFlight: with MaxInFlight 3 the pump hands three
// batches to the deliverer at once, with disjoint keys; a key added again
// while in flight goes out once more only after its batch completed; Stop
// with batches in flight cancels them and keeps their keys.
func TestSeveralBatchesInFlight(t *testing.T) {
	s, _ := newTestSet(t, func(o *Options[int, uint64]) { o.MaxInFlight, o.MaxBatch = 3, 10 })
	calls, deliver := newSinkForTest()
	p, err := NewPump(s, deliver)
	require.NoError(t, err)
	t.Cleanup(p.Stop) // a failed assertion must not leave deliveries parked
	for k := range 40 {
		s.Add(k, 1)
	}
	require.NoError(t, p.Start())
	var held []*delivery
	seen := map[int]bool{}
	for range 3 { // three at once: none is answered yet
		d := <-calls
		held = append(held, d)
		for _, k := range keysOf(d.batch) {
			require.False(t, seen[k], "key %d in two batches in flight", k)
			seen[k] = true
		}
	}
	require.Len(t, seen, 30)
	s.Add(0, 2) // key 0 is in flight: it waits for its batch
	// The three deliveries arrive in any order: complete the one with key 0.
	i := slices.IndexFunc(held, func(d *delivery) bool { return slices.Contains(keysOf(d.batch), 0) })
	require.GreaterOrEqual(t, i, 0)
	held[i].reply <- nil
	d := <-calls // the slot freed: the next batch, keys 30..39 then 0 again
	require.Equal(t, []int{30, 31, 32, 33, 34, 35, 36, 37, 38, 39}, keysOf(d.batch))
	d.reply <- nil
	d = <-calls
	require.Equal(t, []int{0}, keysOf(d.batch))
	require.Equal(t, uint64(2), d.batch[0].Value)
	// Stop with three batches in flight (two held, one new): all cancelled,
	// their keys kept.
	p.Stop()
	require.Equal(t, 21, s.Len(), "the two other held batches (20 keys) and key 0 were in flight: kept")
	require.Equal(t, 3, int(s.Stats().BatchFailures), "the three cancelled batches merged back")
}

// TestFailureWhileAnotherBatchIsInFlight: a whole-batch failure is settled
// (the pump's failure streak is written, and it backs off) while a second
// batch is still being delivered by another worker, which was handed the
// streak when it started. Under -race this failed while workers read the
// streak from the pump's variable instead of a copy. Both batches' keys
// are kept and delivered after the back-off.
func TestFailureWhileAnotherBatchIsInFlight(t *testing.T) {
	s, clk := newTestSet(t, func(o *Options[int, uint64]) { o.MaxInFlight, o.MaxBatch = 2, 10 })
	calls, deliver := newSinkForTest()
	p, err := NewPump(s, deliver)
	require.NoError(t, err)
	t.Cleanup(p.Stop)
	for k := range 20 {
		s.Add(k, 1)
	}
	require.NoError(t, p.Start())
	a, b := <-calls, <-calls
	aKeys := keysOf(a.batch) // the pump reuses the batch's memory once answered
	a.reply <- errors.New("connection lost")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, clk.WaitWaiters(ctx, 1), "the pump backs off")
	b.reply <- nil
	clk.Advance(time.Hour)
	d := <-calls // a's keys again, after the back-off
	require.ElementsMatch(t, aKeys, keysOf(d.batch))
	d.reply <- nil
	require.NoError(t, p.Drain(ctx))
	require.Zero(t, s.Len())
}

package pendingset

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// delivery is one call of the fake sink, parked until the test replies.
// The test may set Results in batch before replying: the pump goroutine is
// blocked on reply, and the channel orders the writes before its reads.
type delivery struct {
	ctx   context.Context
	batch []Entry[int, uint64]
	reply chan error
}

// newSinkForTest returns a deliver function that hands every call to the test on
// calls and returns what the test replies, or ctx.Err() once cancelled.
func newSinkForTest() (chan *delivery, DeliverFunc[int, uint64]) {
	calls := make(chan *delivery)
	return calls, func(ctx context.Context, batch []Entry[int, uint64]) error {
		d := &delivery{ctx: ctx, batch: batch, reply: make(chan error, 1)}
		select {
		case calls <- d:
		case <-ctx.Done():
			return ctx.Err()
		}
		select {
		case err := <-d.reply:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func newTestPump(t *testing.T, edit func(*Options[int, uint64])) (*Set[int, uint64], *Pump[int, uint64], chan *delivery) {
	t.Helper()
	s, _ := newTestSet(t, edit)
	calls, deliver := newSinkForTest()
	p, err := NewPump(s, deliver)
	require.NoError(t, err)
	return s, p, calls
}

// Outcome: with the pump stalled inside a delivery, Add returns
// immediately and keeps doing so for 1M adds; Stop then interrupts the
// stalled delivery and keeps its keys.
func TestPumpStalledAddNeverBlocks(t *testing.T) {
	s, p, calls := newTestPump(t, nil)
	for k := range 10 {
		s.Add(k, 1)
	}
	require.NoError(t, p.Start())
	d := <-calls // the pump is now stuck in deliver until we reply
	require.Len(t, d.batch, 10)

	const adds, keys = 1_000_000, 4096
	for i := range adds {
		s.Add(i%keys, uint64(i+2))
	}
	st := s.Stats()
	require.Equal(t, uint64(10+adds), st.Adds)
	require.Equal(t, 10, st.InFlight)
	require.Equal(t, keys, st.Len)

	p.Stop()
	require.Error(t, d.ctx.Err(), "Stop cancels the stalled delivery")
	st = s.Stats()
	require.Zero(t, st.InFlight, "the interrupted batch merged back")
	require.Equal(t, keys, st.Len, "nothing lost")
	require.Equal(t, uint64(1), st.BatchFailures)
	require.Zero(t, st.KeyFailures)
}

// Stop-now mode: idempotent, returns after the goroutine exits, queued
// keys stay, and Add still works afterwards.
func TestPumpStop(t *testing.T) {
	s, p, calls := newTestPump(t, func(o *Options[int, uint64]) { o.MaxBatch = 2 })
	for k := range 5 {
		s.Add(k, 1)
	}
	require.ErrorIs(t, p.Drain(context.Background()), ErrNotStarted)
	require.NoError(t, p.Start())
	require.ErrorIs(t, p.Start(), ErrAlreadyStarted)
	d := <-calls
	d.reply <- nil
	d = <-calls // the second batch is in flight
	require.Equal(t, []int{2, 3}, keysOf(d.batch))
	p.Stop()
	p.Stop() // no-op
	select {
	case <-p.doneCh:
	default:
		t.Fatal("Stop returned before the goroutine exited")
	}
	require.Equal(t, 3, s.Len(), "keys 2, 3 (interrupted) and 4 (queued) stay")
	require.Zero(t, s.InFlight())
	require.ErrorIs(t, p.Start(), ErrStopped)
	require.ErrorIs(t, p.Drain(context.Background()), ErrStopped)

	s.Add(9, 1) // after Stop: recorded, never blocks
	require.Equal(t, 4, s.Len())
	b := s.Drain(10, nil)
	require.Equal(t, []int{2, 3, 4, 9}, keysOf(b), "interrupted batch first")

	// Stop before Start.
	_, p2, _ := newTestPump(t, nil)
	p2.Stop()
	require.ErrorIs(t, p2.Start(), ErrStopped)
	require.ErrorIs(t, p2.Drain(context.Background()), ErrNotStarted)
}

// Drain-with-deadline mode, success: Drain returns only after queued keys,
// the in-flight batch, a key re-added while in flight, and keys added
// during the drain were all delivered.
func TestPumpDrainDeliversQueuedAndInFlight(t *testing.T) {
	s, p, calls := newTestPump(t, func(o *Options[int, uint64]) { o.MaxBatch = 4 })
	for k := range 10 {
		s.Add(k, 1)
	}
	require.NoError(t, p.Start())
	first := <-calls
	require.Equal(t, []int{0, 1, 2, 3}, keysOf(first.batch))
	s.Add(0, 2) // dirty: one more delivery after this one

	errc := make(chan error, 1)
	go func() { errc <- p.Drain(context.Background()) }()
	got := map[int][]uint64{}
	record := func(d *delivery) {
		for _, e := range d.batch {
			got[e.Key] = append(got[e.Key], e.Value)
		}
	}
	record(first)
	first.reply <- nil
	var err error
	for n := 0; ; n++ {
		select {
		case d := <-calls:
			record(d)
			if n == 0 {
				s.Add(20, 7) // added during the drain: delivered too
			}
			d.reply <- nil
			continue
		case err = <-errc:
		}
		break
	}
	require.NoError(t, err)
	require.Zero(t, s.Len())
	require.Equal(t, []uint64{1, 2}, got[0], "re-added while in flight: once more")
	for k := 1; k < 10; k++ {
		require.Equal(t, []uint64{1}, got[k], "key %d", k)
	}
	require.Equal(t, []uint64{7}, got[20])
	p.Stop() // no-op after Drain
}

// Drain-with-deadline mode, failure: with the target down Drain returns
// ctx.Err() at the deadline, stops the pump and keeps every key, whether
// ctx had already ended when Drain was called or ends while Drain waits.
func TestPumpDrainDeadline(t *testing.T) {
	for _, tc := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		// cancelWhileWaiting: cancel once Drain is waiting, not before.
		cancelWhileWaiting bool
		want               error
	}{
		{"expired deadline", func() (context.Context, context.CancelFunc) {
			return context.WithDeadline(context.Background(), time.Unix(0, 0))
		}, false, context.DeadlineExceeded},
		{"cancelled while backing off", func() (context.Context, context.CancelFunc) {
			return context.WithCancel(context.Background())
		}, true, context.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, clk := newTestSet(t, nil)
			calls := make(chan struct{}, 100)
			p, err := NewPump(s, func(context.Context, []Entry[int, uint64]) error {
				calls <- struct{}{}
				return errConnDown
			})
			require.NoError(t, err)
			waiting := make(chan struct{})
			p.knobs.drainWaits = func() { close(waiting) }
			t.Cleanup(p.Stop) // a failed run leaves no goroutine behind
			for k := range 3 {
				s.Add(k, 1)
			}
			require.NoError(t, p.Start())
			<-calls
			// The pump is (or is about to be) parked on its backoff timer,
			// which the fake clock never fires: the set cannot settle.
			require.NoError(t, clk.WaitWaiters(context.Background(), 1))
			ctx, cancel := tc.ctx()
			defer cancel()
			errc := make(chan error, 1)
			go func() { errc <- p.Drain(ctx) }()
			if tc.cancelWhileWaiting {
				select {
				case <-waiting:
				case err := <-errc:
					t.Fatalf("Drain returned %v before waiting", err)
				}
				select {
				case err := <-errc:
					t.Fatalf("Drain returned %v before its context ended", err)
				default:
				}
				cancel()
			}
			require.ErrorIs(t, <-errc, tc.want)
			require.Equal(t, 3, s.Len(), "no key dropped")
			require.Zero(t, s.InFlight())
			require.Zero(t, s.Stats().KeyFailures)
		})
	}
}

// A whole-batch failure backs the pump off exponentially without spending
// per-key budget; a success resets the pump's backoff.
func TestPumpBatchFailureBacksOff(t *testing.T) {
	s, clk := newTestSet(t, nil)
	calls, deliver := newSinkForTest()
	p, err := NewPump(s, deliver)
	require.NoError(t, err)
	s.Add(1, 1)
	require.NoError(t, p.Start())
	defer p.Stop()

	ctx := context.Background()
	failThenExpect := func(wantDelay time.Duration) {
		t.Helper()
		d := <-calls
		require.Zero(t, d.batch[0].Attempts, "batch failures spend no budget")
		d.reply <- errConnDown
		require.NoError(t, clk.WaitWaiters(ctx, 1))
		got, ok := clk.NextDue()
		require.True(t, ok)
		require.Equal(t, wantDelay, got)
		clk.Advance(got)
	}
	failThenExpect(DefaultBackoffBase)
	failThenExpect(2 * DefaultBackoffBase)
	failThenExpect(4 * DefaultBackoffBase)
	(<-calls).reply <- nil // success resets the pump's backoff
	s.Add(1, 2)
	failThenExpect(DefaultBackoffBase)
	(<-calls).reply <- nil
	st := s.Stats()
	require.Equal(t, uint64(4), st.BatchFailures)
	require.Zero(t, st.KeyFailures)
}

// TestPumpWakeEndsABackoff: a batch refused as busy backs the pump off;
// Wake (the target has room again) retries it at once, without the clock
// moving.
func TestPumpWakeEndsABackoff(t *testing.T) {
	s, clk := newTestSet(t, nil)
	calls, deliver := newSinkForTest()
	p, err := NewPump(s, deliver)
	require.NoError(t, err)
	s.Add(1, 1)
	require.NoError(t, p.Start())
	defer p.Stop()
	(<-calls).reply <- fmt.Errorf("%w: inbox full", ErrBusy)
	require.NoError(t, clk.WaitWaiters(context.Background(), 1)) // backing off
	p.Wake()
	d := <-calls // retried with no clock advance
	require.Equal(t, uint64(1), d.batch[0].Value)
	d.reply <- nil
	require.Equal(t, uint64(1), s.Stats().BatchFailures)
}

// The pump wakes at a backing-off key's deadline without any Add, and
// Drain reports keys left in quarantine instead of waiting for them.
func TestPumpPerKeyBackoffAndQuarantine(t *testing.T) {
	s, clk := newTestSet(t, func(o *Options[int, uint64]) { o.MaxAttempts = 2 })
	calls, deliver := newSinkForTest()
	p, err := NewPump(s, deliver)
	require.NoError(t, err)
	s.Add(1, 1) // poison
	s.Add(2, 1)
	require.NoError(t, p.Start())

	d := <-calls
	require.Equal(t, []int{1, 2}, keysOf(d.batch))
	setResults(d.batch, FailedKey, 1)
	d.reply <- nil
	require.NoError(t, clk.WaitWaiters(context.Background(), 1))
	due, _ := clk.NextDue()
	require.Equal(t, DefaultBackoffBase, due)
	clk.Advance(due)
	d = <-calls
	require.Equal(t, []int{1}, keysOf(d.batch))
	require.Equal(t, 1, d.batch[0].Attempts)
	setResults(d.batch, FailedKey, 1)
	s.Add(3, 1) // keeps flowing while 1 is quarantined
	d.reply <- nil
	d = <-calls
	require.Equal(t, []int{3}, keysOf(d.batch))
	d.reply <- nil

	err = p.Drain(context.Background())
	require.ErrorIs(t, err, ErrQuarantined)
	require.Equal(t, []int{1}, s.QuarantinedKeys(nil))
	require.Equal(t, 1, s.Len())
}

func TestNewPumpInvalidArguments(t *testing.T) {
	s, _ := newTestSet(t, nil)
	_, err := NewPump[int, uint64](nil, func(context.Context, []Entry[int, uint64]) error { return nil })
	require.ErrorIs(t, err, ErrInvalidArgument)
	_, err = NewPump(s, nil)
	require.ErrorIs(t, err, ErrInvalidArgument)
}

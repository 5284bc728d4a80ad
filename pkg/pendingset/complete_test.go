package pendingset

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var errConnDown = errors.New("connection down")

// Outcome: a failed delivery is retried, and the key stays pending until
// success. A per-key failure waits out an exponential backoff first.
func TestFailedKeyRetriedUntilSuccess(t *testing.T) {
	s, clk := newTestSet(t, nil)
	s.Add(1, 1)
	base := DefaultBackoffBase
	for attempt := 1; attempt <= 4; attempt++ {
		b := s.Drain(0, nil)
		require.Equal(t, []int{1}, keysOf(b), "attempt %d", attempt)
		require.Equal(t, attempt-1, b[0].Attempts)
		setResults(b, FailedKey, 1)
		require.NoError(t, s.Complete(b, nil))
		require.Equal(t, 1, s.Len(), "kept until success")

		delay := base << (attempt - 1)
		due, ok := s.NextDue()
		require.True(t, ok)
		require.Equal(t, clk.Now().Add(delay), due)
		clk.Advance(delay - 1)
		require.Empty(t, s.Drain(0, nil), "drained before its backoff ended")
		clk.Advance(1)
	}
	b := s.Drain(0, nil)
	require.Equal(t, 4, b[0].Attempts)
	require.NoError(t, s.Complete(b, nil))
	require.Zero(t, s.Len())
	_, ok := s.NextDue()
	require.False(t, ok)
	st := s.Stats()
	require.Equal(t, uint64(4), st.KeyFailures)
	require.Equal(t, uint64(1), st.Delivered)
	checkInvariants(t, s)
}

// Outcome: whole-batch failures spend no per-key budget. The keys go back
// to the head in order, ahead of keys added later, and a value added
// meanwhile merges in.
func TestBatchFailureSpendsNoBudget(t *testing.T) {
	s, _ := newTestSet(t, func(o *Options[int, uint64]) { o.MaxAttempts = 2 })
	for k := range 3 {
		s.Add(k, 10)
	}
	for range 50 { // far more failures than MaxAttempts
		b := s.Drain(0, nil)
		require.Equal(t, []int{0, 1, 2}, keysOf(b))
		for _, e := range b {
			require.Zero(t, e.Attempts)
		}
		setResults(b, FailedKey, 1) // ignored: the batch failed as a whole
		require.NoError(t, s.Complete(b, errConnDown))
	}
	b := s.Drain(2, nil)
	s.Add(1, 99) // dirty while in flight
	s.Add(7, 1)  // became pending later
	require.NoError(t, s.Complete(b, errConnDown))
	b = s.Drain(0, nil)
	require.Equal(t, []int{0, 1, 2, 7}, keysOf(b))
	require.Equal(t, map[int]uint64{0: 10, 1: 99, 2: 10, 7: 1}, valuesOf(b))
	require.NoError(t, s.Complete(b, nil))
	st := s.Stats()
	require.Equal(t, uint64(51), st.BatchFailures)
	require.Equal(t, uint64(152), st.BatchRetries)
	require.Zero(t, st.KeyFailures)
	require.Zero(t, st.Quarantines)
	require.Zero(t, st.Len)
	checkInvariants(t, s)
}

// Outcome: a poison key is quarantined (counted, visible, not dropped) and
// the other keys keep flowing; it is re-admitted after QuarantineRetry and
// leaves on success.
func TestPoisonKeyQuarantinedOthersFlow(t *testing.T) {
	const maxAttempts = 3
	s, clk := newTestSet(t, func(o *Options[int, uint64]) {
		o.MaxAttempts = maxAttempts
		o.QuarantineRetry = time.Minute
	})
	delivered := map[int]uint64{}
	for round := range 3 * maxAttempts {
		for k := range 5 {
			s.Add(k, uint64(round))
		}
		clk.Advance(DefaultBackoffMax) // every backoff has expired
		b := s.Drain(0, nil)
		if round < maxAttempts {
			require.Contains(t, keysOf(b), 0, "round %d", round)
		} else {
			require.NotContains(t, keysOf(b), 0, "quarantined key drained in round %d", round)
		}
		setResults(b, FailedKey, 0) // key 0 is poison
		require.NoError(t, s.Complete(b, nil))
		for _, e := range b {
			if e.Key != 0 {
				delivered[e.Key] = e.Value
			}
		}
	}
	for k := 1; k < 5; k++ {
		require.Equal(t, uint64(3*maxAttempts-1), delivered[k], "key %d kept flowing", k)
	}
	require.Equal(t, 1, s.Quarantined())
	require.Equal(t, []int{0}, s.QuarantinedKeys(nil))
	st := s.Stats()
	require.Equal(t, uint64(1), st.Quarantines)
	require.Equal(t, uint64(maxAttempts), st.KeyFailures)
	require.Equal(t, 1, st.Len, "quarantined, not dropped")

	// Re-admitted after QuarantineRetry (counted from the quarantine, a
	// few backoffs ago) with the newest merged value; one more failure
	// sends it straight back.
	clk.Advance(time.Minute)
	b := s.Drain(0, nil)
	require.Equal(t, []int{0}, keysOf(b))
	require.Equal(t, uint64(3*maxAttempts-1), b[0].Value)
	require.Equal(t, maxAttempts, b[0].Attempts)
	setResults(b, FailedKey, 0)
	require.NoError(t, s.Complete(b, nil))
	require.Equal(t, 1, s.Quarantined())
	clk.Advance(time.Minute - 1)
	require.Empty(t, s.Drain(0, nil))
	clk.Advance(1)
	b = s.Drain(0, nil)
	require.NoError(t, s.Complete(b, nil))
	st = s.Stats()
	require.Equal(t, uint64(2), st.Readmissions)
	require.Equal(t, uint64(2), st.Quarantines)
	require.Zero(t, st.Len)
	checkInvariants(t, s)
}

// The attempt count survives merges and new adds, in every state, and is
// reset only by a successful delivery.
func TestAttemptsSurviveMergesAndAdds(t *testing.T) {
	s, clk := newTestSet(t, nil)
	s.Add(1, 1)
	fail := func() {
		t.Helper()
		b := s.Drain(0, nil)
		require.Len(t, b, 1)
		s.Add(1, b[0].Value+1) // dirty while in flight
		setResults(b, FailedKey, 1)
		require.NoError(t, s.Complete(b, nil))
		s.Add(1, b[0].Value+2) // while backing off
		clk.Advance(DefaultBackoffMax)
	}
	fail()
	fail()
	b := s.Drain(0, nil)
	require.Equal(t, 2, b[0].Attempts)
	require.Equal(t, uint64(5), b[0].Value)
	s.Add(1, 100)
	require.NoError(t, s.Complete(b, nil)) // delivered, dirty: queued again
	b = s.Drain(0, nil)
	require.Equal(t, 0, b[0].Attempts, "success resets the count")
	require.Equal(t, uint64(100), b[0].Value)
	require.NoError(t, s.Complete(b, nil))
	checkInvariants(t, s)
}

// RetryKey spends no budget and is never quarantined; its backoff grows
// with consecutive transient retries.
func TestRetryKeySpendsNoBudget(t *testing.T) {
	s, clk := newTestSet(t, func(o *Options[int, uint64]) { o.MaxAttempts = 1 })
	s.Add(1, 1)
	for n := 1; n <= 12; n++ {
		b := s.Drain(0, nil)
		require.Equal(t, []int{1}, keysOf(b))
		require.Zero(t, b[0].Attempts)
		setResults(b, RetryKey, 1)
		require.NoError(t, s.Complete(b, nil))
		due, ok := s.NextDue()
		require.True(t, ok)
		// newTestSet's Rand returns 0, so the default jitter shortens
		// nothing: 10ms doubling from the first retry, capped at 5s (n >= 10).
		want := min(10*time.Millisecond<<(n-1), 5*time.Second)
		require.Equal(t, want, due.Sub(clk.Now()), "retry %d", n)
		clk.Advance(due.Sub(clk.Now()))
	}
	st := s.Stats()
	require.Equal(t, uint64(12), st.KeyRetries)
	require.Zero(t, st.KeyFailures)
	require.Zero(t, st.Quarantines)
	checkInvariants(t, s)
}

func TestBackoffSchedule(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		n         int
		jitter, u float64
		want      time.Duration
	}{
		{1, 0, 0, 10 * ms},
		{2, 0, 0, 20 * ms},
		{3, 0, 0, 40 * ms},
		{9, 0, 0, 2560 * ms},
		{10, 0, 0, 5000 * ms}, // capped
		{math.MaxInt, 0, 0, 5000 * ms},
		{0, 0, 0, 10 * ms},
		{1, 0.2, 0.5, 9 * ms}, // shortened by jitter*u
		{10, 0.2, 0.999, 4001 * ms},
		{10, 0.2, 1, 5000 * ms}, // out-of-range u is ignored
		{10, 0.2, -1, 5000 * ms},
	} {
		got := backoff(tc.n, 10*ms, 5*time.Second, tc.jitter, tc.u)
		require.InDelta(t, float64(tc.want), float64(got), float64(ms), "%+v", tc)
		require.LessOrEqual(t, got, 5*time.Second)
	}
	// No overflow with a huge cap.
	require.Equal(t, time.Duration(math.MaxInt64), backoff(200, time.Second, math.MaxInt64, 0, 0))

	// Jitter through the set: each delay lies in [d*(1-J), d].
	u := 0.0
	s, clk := newTestSet(t, func(o *Options[int, uint64]) {
		o.Jitter = 0.5
		o.Rand = func() float64 { return u }
	})
	for k, uu := range []float64{0, 0.5, 0.99} {
		u = uu
		s.Add(k, 1)
		b := s.Drain(0, nil)
		setResults(b, FailedKey, k)
		require.NoError(t, s.Complete(b, nil))
		due, _ := s.NextDue()
		want := DefaultBackoffBase - time.Duration(float64(DefaultBackoffBase)*0.5*uu)
		require.Equal(t, want, due.Sub(clk.Now()))
		clk.Advance(DefaultBackoffBase)
		require.NoError(t, s.Complete(s.Drain(0, nil), nil))
	}
}

// The default serves a backoff in full even when fresh values arrive; with
// Options.Bypass a fresh value may release the key at once, attempts kept.
// Quarantine is never bypassed.
func TestFreshAddAndBackoff(t *testing.T) {
	t.Run("default holds", func(t *testing.T) {
		s, clk := newTestSet(t, nil)
		s.Add(1, 1)
		b := s.Drain(0, nil)
		setResults(b, FailedKey, 1)
		require.NoError(t, s.Complete(b, nil))
		s.Add(1, 2)
		require.Empty(t, s.Drain(0, nil), "backoff bypassed")
		clk.Advance(DefaultBackoffBase)
		b = s.Drain(0, nil)
		require.Equal(t, uint64(2), b[0].Value, "fresh value merged into the waiting one")
		require.NoError(t, s.Complete(b, nil))
	})
	t.Run("bypass", func(t *testing.T) {
		// Release only when the fresh value is at least 100 ahead (think:
		// a new epoch), so both branches are exercised.
		s, _ := newTestSet(t, func(o *Options[int, uint64]) {
			o.MaxAttempts = 3
			o.Bypass = func(waiting, fresh uint64) bool { return fresh >= waiting+100 }
		})
		s.Add(1, 1)
		b := s.Drain(0, nil)
		setResults(b, FailedKey, 1)
		require.NoError(t, s.Complete(b, nil))
		s.Add(1, 50)
		require.Empty(t, s.Drain(0, nil), "Bypass said no")
		s.Add(1, 150)
		b = s.Drain(0, nil)
		require.Equal(t, []int{1}, keysOf(b), "Bypass said yes")
		require.Equal(t, uint64(150), b[0].Value)
		require.Equal(t, 1, b[0].Attempts, "bypass keeps the attempt count")

		// A value added while in flight, newer by 100, skips the backoff
		// of the failure it rides on.
		s.Add(1, 300)
		setResults(b, FailedKey, 1)
		require.NoError(t, s.Complete(b, nil))
		b = s.Drain(0, nil)
		require.Equal(t, uint64(300), b[0].Value)
		require.Equal(t, 2, b[0].Attempts)

		// The third failure quarantines; no fresh value gets it out.
		setResults(b, FailedKey, 1)
		require.NoError(t, s.Complete(b, nil))
		require.Equal(t, 1, s.Quarantined())
		s.Add(1, 10_000)
		require.Empty(t, s.Drain(0, nil), "quarantine bypassed")
		require.Equal(t, uint64(2), s.Stats().Bypasses)
		checkInvariants(t, s)
	})
}

// Misuse of Complete is reported with typed errors and never corrupts the
// set or loses a key.
func TestCompleteMisuse(t *testing.T) {
	s, _ := newTestSet(t, nil)
	s.Add(1, 1)
	s.Add(2, 1)
	b := s.Drain(0, nil)
	stale := append([]Entry[int, uint64](nil), b...)
	require.NoError(t, s.Complete(b, nil))

	s.Add(1, 2) // a new delivery of key 1 that the stale entry must not complete
	fresh := s.Drain(0, nil)
	err := s.Complete(stale, nil)
	require.ErrorIs(t, err, ErrNotInFlight)
	require.Equal(t, 1, s.InFlight(), "the new delivery is still in flight")

	forged := []Entry[int, uint64]{{Key: 1, Value: 9}}
	require.ErrorIs(t, s.Complete(forged, nil), ErrNotInFlight)

	fresh[0].Result = Result(42)
	err = s.Complete(fresh, nil)
	require.ErrorIs(t, err, ErrInvalidResult)
	require.Equal(t, 1, s.Len(), "an unknown result keeps the key")
	require.Equal(t, uint64(1), s.Stats().KeyRetries)
	require.Zero(t, s.Stats().KeyFailures)
	require.NoError(t, s.Complete(nil, nil))
	require.Equal(t, "result(42)", Result(42).String())
	checkInvariants(t, s)

	// A deliverer that edits Key cannot misdirect the completion.
	s.Add(3, 1)
	b = s.Drain(0, nil)
	require.Equal(t, []int{3}, keysOf(b), "key 1 is backing off")
	b[0].Key = 4
	delivered := s.Stats().Delivered
	require.NoError(t, s.Complete(b, nil))
	require.Equal(t, delivered+1, s.Stats().Delivered)
	require.Equal(t, 1, s.Len(), "only key 1 left")

	// Entries of another set are not in flight here.
	other, _ := newTestSet(t, nil)
	other.Add(3, 1)
	ob := other.Drain(0, nil)
	s.Add(3, 1)
	mine := s.Drain(0, nil)
	require.ErrorIs(t, s.Complete(ob, nil), ErrNotInFlight)
	require.NoError(t, s.Complete(mine, nil))
	require.NoError(t, other.Complete(ob, nil))
	checkInvariants(t, s)
}

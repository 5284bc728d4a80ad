package pendingset

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// oracle tracks what a correct set must deliver: for every key, the value
// of its last add (values are drawn from one increasing counter and Merge
// keeps the max, so the last add's value is the max).
type oracle struct {
	lastAdded     map[int]uint64
	lastDelivered map[int]uint64 // the max delivered value, per key
	once          map[uint64]int // delivered value -> key
	// strict: adds happen in value order (one producer), so each key's
	// successful deliveries must strictly increase.
	strict bool
}

func newOracle(strict bool) *oracle {
	return &oracle{lastAdded: map[int]uint64{}, lastDelivered: map[int]uint64{}, once: map[uint64]int{}, strict: strict}
}

// delivered records the successful entries of a completed batch. Every
// value is added once, so a value delivered twice is a duplicate; with one
// producer, a key's deliveries must also strictly increase (a retry never
// brings back an older value).
func (o *oracle) delivered(t testing.TB, b []Entry[int, uint64]) {
	t.Helper()
	for _, e := range b {
		if e.Result != Delivered {
			continue
		}
		_, dup := o.once[e.Value]
		require.False(t, dup, "value %d of key %d delivered twice", e.Value, e.Key)
		o.once[e.Value] = e.Key
		prev, seen := o.lastDelivered[e.Key]
		if o.strict {
			require.True(t, !seen || e.Value > prev, "key %d delivered %d after %d", e.Key, e.Value, prev)
		}
		o.lastDelivered[e.Key] = max(prev, e.Value)
	}
}

// scriptRunner interprets a byte string as a random interleaving of adds,
// drains (several batches may be outstanding), completions with every kind
// of outcome, and clock advances, checking the set's invariants and the
// oracle after every step.
type scriptRunner struct {
	t           testing.TB
	s           *Set[int, uint64]
	clk         interface{ Advance(time.Duration) }
	o           *oracle
	outstanding [][]Entry[int, uint64]
	next        uint64
}

const scriptKeys = 8

func runScript(t testing.TB, script []byte) {
	s, clk := newTestSet(t, func(o *Options[int, uint64]) {
		o.MaxAttempts = 3
		o.QuarantineRetry = time.Second
		o.BackoffMax = 100 * time.Millisecond
	})
	r := &scriptRunner{t: t, s: s, clk: clk, o: newOracle(true)}
	for i := 0; i+1 < len(script); i += 2 {
		r.step(script[i], script[i+1])
		checkInvariants(t, s)
		r.checkNothingLost()
	}
	r.flush()
}

func (r *scriptRunner) step(op, arg byte) {
	t, s := r.t, r.s
	switch op % 8 {
	case 0, 1, 2: // adds are the commonest operation
		k := int(arg % scriptKeys)
		r.next++
		s.Add(k, r.next)
		r.o.lastAdded[k] = r.next
	case 3, 4:
		b := s.Drain(1+int(arg%4), nil)
		for _, e := range b {
			for _, ob := range r.outstanding {
				for _, oe := range ob {
					require.NotEqual(t, oe.Key, e.Key, "key %d in two batches", e.Key)
				}
			}
		}
		if len(b) > 0 {
			r.outstanding = append(r.outstanding, b)
		}
	case 5, 6:
		if len(r.outstanding) == 0 {
			return
		}
		j := int(arg) % len(r.outstanding)
		b := r.outstanding[j]
		r.outstanding = append(r.outstanding[:j], r.outstanding[j+1:]...)
		var err error
		switch arg / 64 {
		case 0: // all delivered
		case 1:
			err = errConnDown
		default: // per-key verdicts
			for e := range b {
				b[e].Result = Result((int(arg) + e) % 3)
			}
		}
		require.NoError(t, s.Complete(b, err))
		if err == nil {
			r.o.delivered(t, b)
		}
	case 7:
		r.clk.Advance(time.Duration(arg) * 5 * time.Millisecond)
	}
}

// checkNothingLost: every key with an add not yet delivered is still held.
func (r *scriptRunner) checkNothingLost() {
	r.s.mu.Lock()
	defer r.s.mu.Unlock()
	for k, v := range r.o.lastAdded {
		if r.o.lastDelivered[k] < v {
			p, held := r.s.findLocked(k)
			require.True(r.t, held && r.s.mu.slots[p].state != stateIdle, "key %d lost (added %d, delivered %d)", k, v, r.o.lastDelivered[k])
		}
	}
}

// flush completes everything successfully until the set is empty, then
// checks the outcome: every key's last add was delivered.
func (r *scriptRunner) flush() {
	t, s := r.t, r.s
	for _, b := range r.outstanding {
		require.NoError(t, s.Complete(b, nil))
		r.o.delivered(t, b)
	}
	r.outstanding = nil
	for round := 0; s.Len() > 0; round++ {
		require.Less(t, round, 100, "set does not empty")
		r.clk.Advance(time.Second) // past every backoff and quarantine
		b := s.Drain(0, nil)
		require.NoError(t, s.Complete(b, nil))
		r.o.delivered(t, b)
	}
	for k, v := range r.o.lastAdded {
		require.Equal(t, v, r.o.lastDelivered[k], "key %d: last add not delivered", k)
	}
	checkInvariants(t, s)
}

// Outcome: every added key is represented in the delivered set after its
// last add, over random interleavings of adds, drains, failures and
// retries (deterministic: seeded scripts).
func TestPropertyRandomInterleavings(t *testing.T) {
	for seed := range uint64(100) {
		rng := rand.New(rand.NewPCG(seed, 0x5eed))
		script := make([]byte, 2*(50+rng.IntN(300)))
		for i := range script {
			script[i] = byte(rng.UintN(256))
		}
		runScript(t, script)
		if t.Failed() {
			t.Fatalf("seed %d", seed)
		}
	}
}

// FuzzScript explores the same interleavings with the fuzzer; without
// -fuzz the seed corpus runs as a test.
func FuzzScript(f *testing.F) {
	f.Add([]byte{0, 1, 0, 1, 3, 0, 0, 1, 5, 200, 7, 255, 3, 0, 5, 0})
	f.Add([]byte{0, 2, 3, 3, 1, 2, 5, 100, 3, 3, 5, 130, 7, 40, 3, 3, 5, 0})
	f.Add([]byte{0, 0, 0, 1, 0, 2, 3, 3, 6, 128, 3, 3, 6, 128, 3, 3, 6, 128, 7, 255, 3, 3, 6, 0})
	f.Fuzz(func(t *testing.T, script []byte) { runScript(t, script) })
}

// The same outcome with real concurrency, for -race: producers add while a
// consumer drains and completes with random outcomes and moves the clock.
func TestPropertyConcurrent(t *testing.T) {
	const producers, addsEach, keys = 4, 20_000, 64
	s, clk := newTestSet(t, func(o *Options[int, uint64]) {
		o.MaxAttempts = 4
		o.MaxBatch = 16
		o.QuarantineRetry = time.Second
	})
	var counter atomic.Uint64
	var maxAdded [keys]atomic.Uint64
	var wg sync.WaitGroup
	done := make(chan struct{})
	for p := range producers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(p), 1))
			for range addsEach {
				k := rng.IntN(keys)
				v := counter.Add(1)
				// Record the max before adding, so the oracle is never behind.
				for old := maxAdded[k].Load(); old < v && !maxAdded[k].CompareAndSwap(old, v); old = maxAdded[k].Load() {
				}
				s.Add(k, v)
			}
		})
	}
	go func() { wg.Wait(); close(done) }()

	o := newOracle(false)
	rng := rand.New(rand.NewPCG(42, 42))
	var b []Entry[int, uint64]
	producing := true
	for producing {
		select {
		case <-s.Doorbell():
		case <-done:
			producing = false
		}
		for {
			clk.Advance(time.Duration(rng.IntN(20)) * time.Millisecond)
			b = s.Drain(0, b[:0])
			if len(b) == 0 {
				break
			}
			var err error
			if rng.IntN(10) == 0 {
				err = errConnDown
			} else {
				for j := range b {
					b[j].Result = Result(rng.IntN(5) % 3) // mostly delivered
				}
			}
			require.NoError(t, s.Complete(b, err))
			if err == nil {
				o.delivered(t, b)
			}
		}
	}
	for round := 0; s.Len() > 0; round++ {
		require.Less(t, round, 100)
		clk.Advance(time.Second)
		b = s.Drain(0, b[:0])
		require.NoError(t, s.Complete(b, nil))
		o.delivered(t, b)
	}
	for k := range keys {
		if m := maxAdded[k].Load(); m > 0 {
			require.Equal(t, m, o.lastDelivered[k], "key %d", k)
		}
	}
	st := s.Stats()
	require.Equal(t, uint64(producers*addsEach), st.Adds)
	require.LessOrEqual(t, st.MaxLen, keys)
	require.Positive(t, st.Coalesced)
	checkInvariants(t, s)
}

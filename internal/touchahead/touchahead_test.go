package touchahead

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// itemForTest is the shape of a per-dispatcher struct: a lock and a word
// the work checks, on different cache lines.
type itemForTest struct {
	gen   atomic.Uint64
	mu    sync.Mutex
	n     uint64
	_     [128]byte
	state atomic.Uint64
}

func shuffledItems(n int) []*itemForTest {
	items := make([]*itemForTest, n)
	for i := range items {
		items[i] = new(itemForTest)
	}
	rand.New(rand.NewPCG(uint64(n), 7)).Shuffle(n, func(i, j int) { items[i], items[j] = items[j], items[i] })
	return items
}

// work is what a hot loop does per item: read a state word, take the
// item's lock, change it.
func work(it *itemForTest) {
	if it.gen.Load() == 1 || it.state.Load() == 1 {
		return
	}
	it.mu.Lock()
	it.n++
	it.mu.Unlock()
}

func round(items []*itemForTest, ahead bool) {
	for rest := items; len(rest) > 0; {
		chunk := rest[:min(len(rest), Chunk)]
		rest = rest[len(chunk):]
		if ahead {
			for _, it := range chunk {
				it.gen.Load()
				it.state.Load()
			}
		}
		for _, it := range chunk {
			work(it)
		}
	}
}

// TestTouchingChangesNothing: the touch reads only; a round with it does
// exactly the work of a round without.
func TestTouchingChangesNothing(t *testing.T) {
	items := shuffledItems(1000)
	items[3].state.Store(1)
	round(items, false)
	round(items, true)
	for i, it := range items {
		want := uint64(2)
		if i == 3 {
			want = 0
		}
		require.Equal(t, want, it.n, "item %d", i)
	}
}

// BenchmarkTouchAhead: one round over a million items in shuffled order,
// without and with the touch-ahead pass, in ns per item.
func BenchmarkTouchAhead(b *testing.B) {
	items := shuffledItems(1 << 20)
	for _, ahead := range []bool{false, true} {
		b.Run(fmt.Sprintf("ahead=%v", ahead), func(b *testing.B) {
			for b.Loop() {
				round(items, ahead)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(items)), "ns/item")
		})
	}
}

// TestLockReadsTheMutexWord: Lock reads the mutex's state word (0 when
// free, not 0 when held), and taking and giving the lock still works
// around it: the touch changes nothing.
func TestLockReadsTheMutexWord(t *testing.T) {
	var mu sync.Mutex
	require.Zero(t, Lock(&mu))
	mu.Lock()
	require.NotZero(t, Lock(&mu), "Lock must read the state word, not some other memory")
	mu.Unlock()
	require.Zero(t, Lock(&mu))
	require.True(t, mu.TryLock())
	mu.Unlock()
}

// TestLockRacesWithNothing: under -race, Lock on a mutex other goroutines
// take and give is not a data race (its read is atomic, as theirs are).
func TestLockRacesWithNothing(t *testing.T) {
	var mu sync.Mutex
	n := 0
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 1000 {
				Lock(&mu)
				mu.Lock()
				n++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	require.Equal(t, 4000, n)
}

// Package touchahead holds the one constant of the touch-ahead pattern:
// a loop over many items whose state is cold in the caches (a million
// dispatchers, each touched in an order unrelated to where it lies in
// memory) first reads, for a chunk of Chunk items, one word of each cache
// line the real work will need, and only then does the work on that chunk.
//
// Why: the real work of one item takes locks, compare-and-swaps and
// branches. On x86 a locked instruction waits for every load before it,
// and the reorder buffer holds only a few iterations of a long body, so
// the loop misses the caches one item at a time: hundreds of nanoseconds
// each on this machine (a PVM guest, where a TLB miss costs a page walk
// through two page tables). The touch loop is a few instructions per item
// with no dependency between items, so the processor has many of its
// misses in flight at once; when the work reaches an item its lines are
// in the cache. Go has no prefetch instruction; a discarded atomic Load
// is a plain load the compiler keeps (a discarded plain field read is
// not: it becomes a nil check of the first word).
//
// The touch must read a word of every line the work reads first (a lock
// word, a state word): a line it leaves out is missed by the work as
// before. BenchmarkTouchAhead here (a lock and a state word on two lines,
// a million items in shuffled order) measures it with and without the
// touch; docs/benchmarks.md has its figures and BenchmarkKeepaliveRound's.
//
// Two reads a plain field read cannot do are here too: Lock reads a
// sync.Mutex's word (atomically, so it races with nothing) when the line
// the work needs first is a lock's, and Keep keeps a touch's sum of plain
// reads when the caller runs on many goroutines and has no field of its
// own to store it in.
//
// Invariant: a touch only reads. It changes nothing and decides nothing,
// so removing it changes no behaviour, only speed.
package touchahead

// Chunk is how many items are touched ahead of the work: enough to keep
// the processor's outstanding misses busy, few enough that the chunk's
// lines are still in the first-level caches when the work reaches them.
const Chunk = 32

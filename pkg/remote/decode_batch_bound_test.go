package remote

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/messaging"
)

// A ResolvedBatch's entry count is checked against the bytes left, at
// minBatchEntryBytes an entry, before its entries are allocated: a frame
// claiming the most entries a batch may have (MaxResolvedBatchEntries) in
// fewer bytes than they take is refused by the count (ErrMalformed naming
// the entries), and decoding it allocates within maxDecodeAmplification
// times the frame, not the claimed entries (56 bytes each) per byte. The
// frames: a byte per claimed entry, and one byte short of the fewest the
// entries take. (Decoding is single-goroutine; the allocation is measured
// over many decodes so that the runtime's own allocations do not count.)
func TestAResolvedBatchCountTheFrameCannotHoldIsRefusedBeforeAllocating(t *testing.T) {
	const n = messaging.MaxResolvedBatchEntries
	frames := map[string][]byte{
		"a byte per entry":       resolvedBatchFrame(n, make([]byte, n)),
		"a byte short of enough": resolvedBatchFrame(n, make([]byte, n*minBatchEntryBytes-1)),
	}
	for name, b := range frames {
		_, err := decodeMessages(b)
		require.ErrorIs(t, err, ErrMalformed, name)
		require.ErrorContains(t, err, "resolved-ts entries in", "%s: refused by the count, not after reading entries", name)

		const decodes = 200
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for range decodes {
			_, _ = decodeMessages(b)
		}
		runtime.ReadMemStats(&after)
		allocated := (after.TotalAlloc - before.TotalAlloc) / decodes
		require.LessOrEqual(t, allocated, uint64(maxDecodeAmplification*len(b)), "%s: %d bytes for a %d-byte frame", name, allocated, len(b))
		t.Logf("%s: %d-byte frame, %d bytes allocated (%.2fx)", name, len(b), allocated, float64(allocated)/float64(len(b)))
	}
}

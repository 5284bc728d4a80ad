package eventcollector

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestACollectorDispatcherFitsItsSizeClass: a collector's dispatcher
// stays within the 128-byte size class (its flags share words; with a
// flag between each pair of timestamps it took 152 bytes, the 160-byte
// class: 32 MB at a million dispatchers).
func TestACollectorDispatcherFitsItsSizeClass(t *testing.T) {
	require.LessOrEqual(t, unsafe.Sizeof(dispatcher{}), uintptr(128))
}

// TestAMemorySinkEntryStaysSmall: the memory sink's entry, carved from a
// slab (so its exact size counts, not a size class), stays at 176 bytes:
// its first epoch's record inline without the rows slice EpochRecord
// carries, no pointer to the current epoch, 32-bit counts. It took 224
// bytes, 48 MB more at a million dispatchers.
func TestAMemorySinkEntryStaysSmall(t *testing.T) {
	require.LessOrEqual(t, unsafe.Sizeof(memDispatcher{}), uintptr(176))
}

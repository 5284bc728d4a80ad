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

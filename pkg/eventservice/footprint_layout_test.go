package eventservice

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestADispatcherFitsItsSizeClass: a dispatcher, its first session inside,
// stays within the 320-byte size class (its span packed: a common.Span in
// it took 40 bytes more, the next class, 384; 64 MB at a million
// dispatchers).
func TestADispatcherFitsItsSizeClass(t *testing.T) {
	require.LessOrEqual(t, unsafe.Sizeof(dispatcher{}), uintptr(320))
}

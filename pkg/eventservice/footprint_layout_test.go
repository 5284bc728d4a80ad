package eventservice

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// TestADispatcherFitsItsSizeClass: a dispatcher, its first session inside,
// stays within the 288-byte size class (its span packed: a common.Span in
// it took 40 bytes more, the class of 384; its registration's start-ts
// read from the first session, the session's inSet in queued's padding and
// the store's handle one pointer took it from 312 bytes, the 320 class:
// 32 MB at a million dispatchers).
func TestADispatcherFitsItsSizeClass(t *testing.T) {
	require.LessOrEqual(t, unsafe.Sizeof(dispatcher{}), uintptr(288))
}

package touchahead

import (
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Lock reads the state word of m without taking it or waiting, so that a
// chunk's lock words can be touched ahead of the Locks that will take
// them (a Lock's compare-and-swap on a line not in the cache waits for
// the line, one lock at a time). The read is atomic, as every access to
// a Mutex's state is, so it races with nothing; its value means nothing
// and must not be used for a decision.
func Lock(m *sync.Mutex) uint32 {
	// A sync.Mutex is its state word (int32) followed by its semaphore;
	// TestLockReadsTheMutexWord holds that.
	return (*atomic.Uint32)(unsafe.Pointer(m)).Load()
}

// Keep keeps the sum of a touch's plain reads alive, so the compiler
// does not drop them (a discarded plain read becomes a nil check), where
// the caller has no field of its own to store it in (a function called
// from many goroutines). It costs a spill to the stack.
func Keep(sum uint64) {
	runtime.KeepAlive(sum)
}

//go:build !linux

package hugepages

// Advise returns ErrUnsupported: transparent huge pages are Linux's.
func Advise() (int64, error) { return 0, ErrUnsupported }

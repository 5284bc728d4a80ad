// Package hugepages asks the kernel to back this process's large anonymous
// memory (the Go heap, above all) with transparent huge pages, for hosts
// whose THP mode is "madvise" (the common default): there a process gets
// huge pages only for ranges it advised with MADV_HUGEPAGE, and the Go
// runtime advises none.
//
// Why: at a million dispatchers an advance walks about ten per-dispatcher
// structures, each a cold cache line and, with 4 KiB pages, a TLB miss,
// which huge pages spare (the THP rows of docs/benchmarks.md, "Scale
// runs"). This package gets what THP "always" gives without root or a
// host-wide setting.
//
// Invariants: Advise only adds MADV_HUGEPAGE to private, writable,
// anonymous mappings of at least MinBytes; it never maps, unmaps or
// changes the protection of memory, so the worst it does is what THP
// "always" would do to those ranges. The heap grows by new mappings, which
// do not inherit the advice, so a Keeper advises again every Interval: the
// work is one read of /proc/self/maps (a few dozen lines for a Go process)
// and one madvise per large mapping, whatever the heap holds. Goroutines:
// Keeper.Start starts one, Close stops it and waits. On systems other than
// Linux, Advise and Start return ErrUnsupported.
package hugepages

// Package dueheap is a min-heap of items ordered by when they are due: the
// one scheduling structure behind the event service's back-off timers and
// the event store's GC, idle-expiry and notify schedules, so that a million
// pending items cost a million entries and one timer, not a million timers.
//
// Invariant: Peek and PopDue see the earliest due time first; the heap does
// no locking (its owner's lock guards it) and holds no package state.
package dueheap

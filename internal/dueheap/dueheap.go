package dueheap

import (
	"container/heap"
	"time"
)

// Entry is an item scheduled at Due.
type Entry[T any] struct {
	Due  time.Time
	Item T
}

// Heap is a min-heap of entries by Due. The zero value is empty and ready.
type Heap[T any] struct{ h entries[T] }

// Push schedules item at due.
func (h *Heap[T]) Push(due time.Time, item T) { heap.Push(&h.h, Entry[T]{Due: due, Item: item}) }

// Len returns the number of entries.
func (h *Heap[T]) Len() int { return len(h.h) }

// Peek returns the earliest entry, and false when the heap is empty.
func (h *Heap[T]) Peek() (Entry[T], bool) {
	if len(h.h) == 0 {
		return Entry[T]{}, false
	}
	return h.h[0], true
}

// PopDue removes the entries due at now (Due not after it), earliest first,
// appends them to dst and returns it.
func (h *Heap[T]) PopDue(now time.Time, dst []Entry[T]) []Entry[T] {
	for len(h.h) > 0 && !h.h[0].Due.After(now) {
		dst = append(dst, heap.Pop(&h.h).(Entry[T]))
	}
	return dst
}

type entries[T any] []Entry[T]

func (e entries[T]) Len() int           { return len(e) }
func (e entries[T]) Less(i, j int) bool { return e[i].Due.Before(e[j].Due) }
func (e entries[T]) Swap(i, j int)      { e[i], e[j] = e[j], e[i] }
func (e *entries[T]) Push(x any)        { *e = append(*e, x.(Entry[T])) }
func (e *entries[T]) Pop() any {
	old := *e
	x := old[len(old)-1]
	old[len(old)-1] = Entry[T]{} // drop the reference to the item
	*e = old[:len(old)-1]
	return x
}

package messaging

import (
	"context"
	"fmt"
	"sync"
)

// inboxState is the lifecycle of an Inbox: open, then finally unregistered
// or closed (with its transport). Only open inboxes accept messages.
type inboxState uint8

const (
	inboxOpen inboxState = iota
	inboxUnregistered
	inboxClosed
)

// entry is one queued message and the size and weight it was charged.
type entry struct {
	msg    Message
	size   int
	weight int
}

// minRing is the ring's first allocation; it then doubles up to capacity, so
// a quiet target costs little and a busy one stops allocating once grown.
const minRing = 64

// Inbox is the receiving end of one target of an InProcess transport: a
// bounded FIFO queue plus a doorbell.
//
// Typical receiver loop:
//
//	for {
//		select {
//		case <-in.Ready():
//			batch = in.Drain(batch[:0], 0)
//			... apply batch ...
//		case <-in.Done():
//			batch = in.Drain(batch[:0], 0) // what was accepted before closing
//			return
//		}
//	}
//
// or Receive, which wraps the same. The receiver applies back-pressure simply
// by not draining: once the queue is full, Send refuses with ErrBusy.
//
// INVARIANT: mu.n <= mu.weight <= capacity (a message's Weight: a
// ResolvedBatch counts its entries), and, when maxBytes > 0, mu.bytes <=
// maxBytes or the inbox holds one oversized batch alone (admitted into
// an empty inbox, so a message larger than the bound still gets through).
// INVARIANT: once the state leaves inboxOpen nothing is enqueued again, and
// done is closed.
// INVARIANT (no lost wakeup): whenever the queue is non-empty after an
// operation, a token is in ready, or a receiver is inside Drain and will
// re-ring if it leaves messages behind.
// Lock order: Inbox.mu is a leaf; InProcess.mu may be held when taking it.
type Inbox struct {
	target   Target
	capacity int
	maxBytes int
	// ready is the doorbell: capacity one, rung without blocking.
	ready chan struct{}
	// done is closed when the inbox stops accepting messages.
	done chan struct{}

	mu struct {
		sync.Mutex
		// buf is a ring of len(buf) slots; the queued entries are
		// buf[head], buf[head+1 mod len], ... (n of them).
		buf     []entry
		head, n int
		weight  int // the queued messages' Weight
		bytes   int
		// need is the largest batch refused for its bytes since Room was
		// last given: there is room once it fits or the inbox is empty.
		need  int
		state inboxState
		// room, if not nil, is closed (and reset) once the queue is at or
		// below half its bounds: a refused sender waits on it (Room).
		room chan struct{}
	}
}

// closedRoom returns a closed channel: Room's answer when there is room
// already.
func closedRoom() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// Room returns a channel closed once the inbox has room again: at once if
// it is at or below half its bounds (or no longer open), otherwise at the
// Drain that brings it there. After a batch was refused for its bytes,
// room also means that batch fits, or the inbox is empty (an oversized
// batch goes in alone). See RoomNotifier.
func (in *Inbox) Room() <-chan struct{} {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.mu.state != inboxOpen || in.hasRoomLocked() {
		return closedRoom()
	}
	if in.mu.room == nil {
		in.mu.room = make(chan struct{})
	}
	return in.mu.room
}

// HasRoom reports whether Room would return a closed channel now.
func (in *Inbox) HasRoom() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.mu.state != inboxOpen || in.hasRoomLocked()
}

// hasRoomLocked reports whether the queue is empty, or at or below half its
// bounds with room for the largest batch refused for its bytes (need):
// enough room for a refused sender to be worth waking. REQUIRES: in.mu held.
func (in *Inbox) hasRoomLocked() bool {
	if in.mu.n == 0 {
		return true
	}
	return 2*in.mu.weight <= in.capacity && (in.maxBytes <= 0 || (2*in.mu.bytes <= in.maxBytes && in.mu.bytes+in.mu.need <= in.maxBytes))
}

func newInbox(target Target, capacity, maxBytes int) *Inbox {
	return &Inbox{
		target:   target,
		capacity: capacity,
		maxBytes: maxBytes,
		ready:    make(chan struct{}, 1),
		done:     make(chan struct{}),
	}
}

// Target returns the name the inbox was registered under.
func (in *Inbox) Target() Target { return in.target }

// Ready returns the doorbell: it holds a token whenever messages may be
// waiting. A token can be stale (Drain then returns nothing); a wakeup is
// never lost.
func (in *Inbox) Ready() <-chan struct{} { return in.ready }

// Done returns a channel closed once the inbox accepts no more messages
// (unregistered or transport closed). Messages accepted before remain
// drainable.
func (in *Inbox) Done() <-chan struct{} { return in.done }

// Len returns the queued messages' weight (Weight: a ResolvedBatch counts
// its entries), the count Capacity bounds.
func (in *Inbox) Len() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.mu.weight
}

// Bytes returns the approximate bytes queued; always zero when the transport
// has no byte bound (sizes are then not computed).
func (in *Inbox) Bytes() int {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.mu.bytes
}

// Drain removes up to limit queued messages (all of them if limit <= 0) in
// FIFO order, appends them to dst and returns it. It never blocks.
func (in *Inbox) Drain(dst []Message, limit int) []Message {
	dst, left, _ := in.drain(dst, limit)
	if left > 0 {
		in.ring() // Keep the no-lost-wakeup invariant for what we left behind.
	}
	return dst
}

// Receive returns at least one message (up to limit, all if limit <= 0)
// appended to dst, waiting for one if the queue is empty. Once the inbox is closed and
// empty it returns an error wrapping ErrClosed; if ctx ends first, ctx.Err().
func (in *Inbox) Receive(ctx context.Context, dst []Message, limit int) ([]Message, error) {
	for {
		before := len(dst)
		var left int
		var state inboxState
		dst, left, state = in.drain(dst, limit)
		if left > 0 {
			in.ring()
		}
		if len(dst) > before {
			return dst, nil
		}
		if state != inboxOpen {
			return dst, fmt.Errorf("%w: inbox %q", ErrClosed, in.target)
		}
		select {
		case <-ctx.Done():
			return dst, ctx.Err()
		case <-in.ready:
		case <-in.done:
		}
	}
}

// drain pops up to limit entries into dst and reports how many are left and
// the state, all read under one lock so "empty and closed" is exact.
func (in *Inbox) drain(dst []Message, limit int) ([]Message, int, inboxState) {
	in.mu.Lock()
	defer in.mu.Unlock()
	k := in.mu.n
	if limit > 0 && limit < k {
		k = limit
	}
	for range k {
		e := &in.mu.buf[in.mu.head]
		dst = append(dst, e.msg)
		in.mu.bytes -= e.size
		in.mu.weight -= e.weight
		*e = entry{} // Do not keep delivered messages alive.
		in.mu.head++
		if in.mu.head == len(in.mu.buf) {
			in.mu.head = 0
		}
	}
	in.mu.n -= k
	if in.hasRoomLocked() {
		in.mu.need = 0 // the refused batch fits now: its sender is woken
		if in.mu.room != nil {
			close(in.mu.room)
			in.mu.room = nil
		}
	}
	return dst, in.mu.n, in.mu.state
}

// ring puts a token in the doorbell unless one is already there.
func (in *Inbox) ring() {
	select {
	case in.ready <- struct{}{}:
	default:
	}
}

// enqueue appends all of msgs or none. REQUIRES: every element is non-nil.
func (in *Inbox) enqueue(msgs []Message) error {
	w := WeightOf(msgs)
	if w > in.capacity {
		return fmt.Errorf("%w: %d messages (weight %d) for target %q, capacity %d", ErrBatchTooLarge, len(msgs), w, in.target, in.capacity)
	}
	in.mu.Lock()
	if err := in.enqueueLocked(msgs, w); err != nil {
		in.mu.Unlock()
		return err
	}
	in.mu.Unlock()
	if len(msgs) > 0 {
		in.ring()
	}
	return nil
}

// enqueueLocked is enqueue's body; w is msgs' weight. REQUIRES: in.mu
// held, len(msgs) <= w <= capacity.
func (in *Inbox) enqueueLocked(msgs []Message, w int) error {
	switch in.mu.state {
	case inboxUnregistered:
		return fmt.Errorf("%w: %q was unregistered", ErrUnknownTarget, in.target)
	case inboxClosed:
		return fmt.Errorf("%w: transport closed, target %q", ErrClosed, in.target)
	}
	if in.mu.weight+w > in.capacity {
		return ErrBusy
	}
	in.growLocked(in.mu.n + len(msgs))
	// Write into the free slots first and only then commit n, so a batch
	// that turns out too big in bytes leaves no trace.
	size, end := len(in.mu.buf), in.mu.head+in.mu.n
	total := 0
	for i, m := range msgs {
		e := &in.mu.buf[(end+i)%size]
		e.msg, e.weight = m, Weight(m)
		if in.maxBytes > 0 {
			e.size = m.Size()
			total += e.size
		}
	}
	// A batch beyond the byte bound is admitted alone into an empty inbox:
	// a row can be far larger than any bound (a TOASTed value up to 1 GB),
	// and refusing it for good would stall its dispatcher for ever. While
	// others are held it waits (ErrBusy) for the inbox to empty, and Room
	// waits for that too (need), not merely for half the bound.
	if in.maxBytes > 0 && total > 0 && in.mu.bytes+total > in.maxBytes && in.mu.n > 0 {
		for i := range msgs {
			in.mu.buf[(end+i)%size] = entry{}
		}
		in.mu.need = max(in.mu.need, total)
		return ErrBusy
	}
	in.mu.n += len(msgs)
	in.mu.weight += w
	in.mu.bytes += total
	return nil
}

// growLocked makes the ring hold at least need entries, doubling, never
// beyond capacity. REQUIRES: in.mu held, need <= capacity.
func (in *Inbox) growLocked(need int) {
	if need <= len(in.mu.buf) {
		return
	}
	size := max(len(in.mu.buf)*2, min(minRing, in.capacity), need)
	size = min(size, in.capacity)
	buf := make([]entry, size)
	for i := range in.mu.n {
		buf[i] = in.mu.buf[(in.mu.head+i)%len(in.mu.buf)]
	}
	in.mu.buf, in.mu.head = buf, 0
}

// shut stops the inbox accepting messages and wakes receivers. Idempotent;
// the first reason wins.
func (in *Inbox) shut(state inboxState) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.mu.state != inboxOpen {
		return
	}
	in.mu.state = state
	close(in.done)
	if in.mu.room != nil {
		close(in.mu.room) // senders waiting for room learn it is gone
		in.mu.room = nil
	}
}

package eventstore

import (
	"context"
	"fmt"
	"sync"

	"github.com/cdcflow/eventservice/internal/touchahead"
	"github.com/cdcflow/eventservice/pkg/common"
)

// PushResolved advances the resolved-ts of every subscription in sinks to
// ts in one call: for each sink what Push(ctx, Batch{ResolvedTs: ts})
// does, with errs[i] (len(errs) == len(sinks)) what that Push would have
// returned. Real upstreams advance many subscriptions at once (a
// PostgreSQL source every table at each commit or keepalive, a TiKV store
// every region it leads); one call costs one queue send per write worker
// (and chunk of advanceChunk) instead of one per subscription, and the
// worker applies each as one event, with one pass of notifications. Sinks of this package's Store
// are grouped; any other Sink gets its Push, in order.
//
// A subscription whose resolved-ts is already ts is left alone (nil); one
// above ts gets ErrResolvedTsRegressed, an ended one ErrClosed, and when
// ctx ends or the store closes before a worker took its group, every sink
// of the group gets the error and keeps its resolved-ts (the call may be
// retried). The sinks of one call should be distinct; the caller must not
// push to them concurrently with the call (an upstream pushes a
// subscription from one goroutine).
func PushResolved(ctx context.Context, sinks []Sink, ts common.Ts, errs []error) {
	if len(errs) != len(sinks) {
		panic("eventstore: PushResolved with errs and sinks of different lengths")
	}
	// A call's sinks are usually of one store, so of len(queues) groups
	// (two by default): a slice searched linearly, not a map. Each group
	// fills a buffer of the store's (advanceBuf) chunk after chunk; a
	// chunk's buffer goes to the worker with its event, which gives it back.
	var groups []advanceGroup
	for i, k := range sinks {
		if i%touchahead.Chunk == 0 {
			touchSinks(sinks[i:min(i+touchahead.Chunk, len(sinks))])
		}
		errs[i] = nil
		sk, ok := k.(*sink)
		if !ok || ts == 0 {
			errs[i] = k.Push(ctx, Batch{ResolvedTs: ts})
			continue
		}
		prev, err := sk.reserveAdvance(ts)
		if err != nil || prev == ts {
			errs[i] = err
			continue
		}
		key := advanceGroupKey{s: sk.store, worker: (*subscription)(sk).worker()}
		g := groupOf(&groups, key)
		chunk := min(advanceChunk, sk.store.opts.WriteQueueSize)
		if g.buf == nil {
			g.buf = sk.store.getAdvanceBuf(chunk)
		}
		b := g.buf
		b.subs = append(b.subs, (*subscription)(sk))
		b.prev = append(b.prev, prev)
		b.idx = append(b.idx, i)
		if len(b.subs) == chunk {
			g.flush(ctx, ts, errs)
		}
	}
	for i := range groups {
		groups[i].flush(ctx, ts, errs)
	}
}

// touchSinks reads the lock words reserveAdvance will take of a chunk of
// the store's sinks (the push lock, the subscription's lock) before it
// takes them, so that their cache misses overlap (internal/touchahead).
// It changes nothing.
func touchSinks(sinks []Sink) {
	for _, k := range sinks {
		if sk, ok := k.(*sink); ok {
			sub := (*subscription)(sk)
			touchahead.Lock(&sub.pushMu)
			touchahead.Lock(&sub.mu.Mutex)
		}
	}
}

// groupOf returns the group of key in *groups, appending it if missing.
func groupOf(groups *[]advanceGroup, key advanceGroupKey) *advanceGroup {
	for i := range *groups {
		if (*groups)[i].key == key {
			return &(*groups)[i]
		}
	}
	*groups = append(*groups, advanceGroup{key: key})
	return &(*groups)[len(*groups)-1]
}

// advanceChunk is how many advances of one write worker go in one event:
// the worker starts on a chunk while the caller reserves the next, where
// one event for the whole call kept it idle until the call's end.
const advanceChunk = 256

// flush queues g's advances as one event and starts g afresh (the worker
// owns the queued slice); on failure its sinks get the error and their
// resolved-ts back.
func (g *advanceGroup) flush(ctx context.Context, ts common.Ts, errs []error) {
	b := g.buf
	if b == nil {
		return
	}
	g.buf = nil
	if err := g.key.s.enqueueAdvance(ctx, g.key.worker, b, ts); err != nil {
		for j, sub := range b.subs {
			sub.unreserveAdvance(ts, b.prev[j])
			errs[b.idx[j]] = err
		}
		g.key.s.putAdvanceBuf(b)
	}
}

type advanceGroupKey struct {
	s      *Store
	worker int
}

// advanceGroup is the subscriptions of one write worker in a PushResolved
// call, a chunk at a time in buf (nil between chunks).
type advanceGroup struct {
	key advanceGroupKey
	buf *advanceBuf
}

// advanceBuf is a chunk of a PushResolved call's advances on one write
// worker: subs[j] was sinks[idx[j]], its resolved-ts prev[j] before. Its
// event takes it to the worker, which gives it back to the store's pool
// once it published the advances; a chunk that was never queued goes back
// at once. Pooled, because allocated per call at a million dispatchers
// they brought the GC's long cycles forward (docs/benchmarks.md,
// "Garbage").
type advanceBuf struct {
	subs []*subscription
	prev []common.Ts
	idx  []int
}

// getAdvanceBuf returns an empty buffer with room for chunk advances.
func (s *Store) getAdvanceBuf(chunk int) *advanceBuf {
	if b, ok := s.advanceBufs.Get().(*advanceBuf); ok && cap(b.subs) >= chunk {
		return b
	}
	return &advanceBuf{subs: make([]*subscription, 0, chunk), prev: make([]common.Ts, 0, chunk), idx: make([]int, 0, chunk)}
}

// putAdvanceBuf empties b (its subscriptions no longer kept alive by it)
// and pools it.
func (s *Store) putAdvanceBuf(b *advanceBuf) {
	clear(b.subs)
	b.subs, b.prev, b.idx = b.subs[:0], b.prev[:0], b.idx[:0]
	s.advanceBufs.Put(b)
}

// reserveAdvance validates an advance of the subscription to ts and
// records it as pushed, returning the previous pushed resolved-ts (equal to
// ts: nothing to do). Rows at or below ts are refused from now on, as
// after a Push of ts; unreserveAdvance undoes it if the advance never
// reaches the queue.
func (k *sink) reserveAdvance(ts common.Ts) (prev common.Ts, err error) {
	sub := (*subscription)(k)
	s := sub.store
	sub.pushMu.Lock()
	defer sub.pushMu.Unlock()
	switch {
	case s.isClosing():
		return 0, ErrClosed
	case sub.isRemoved():
		return 0, fmt.Errorf("%w: subscription %d of %v has ended", ErrClosed, sub.id, sub.span)
	case ts < sub.pushedResolved:
		return 0, fmt.Errorf("%w: %v below %v for %v", ErrResolvedTsRegressed, ts, sub.pushedResolved, sub.span)
	}
	prev = sub.pushedResolved
	sub.pushedResolved = ts
	return prev, nil
}

// unreserveAdvance puts back the pushed resolved-ts an advance to ts had
// taken, unless a later push moved it since.
func (sub *subscription) unreserveAdvance(ts, prev common.Ts) {
	sub.pushMu.Lock()
	defer sub.pushMu.Unlock()
	if sub.pushedResolved == ts {
		sub.pushedResolved = prev
	}
}

// enqueueAdvance queues one event advancing b.subs (all of worker's) to
// ts; the event owns b from then on.
// It first takes room for len(subs) advances: the queue bounds events,
// and an event of 256 advances let an upstream run 256 times further ahead
// of the writer than pushes one at a time did, filling the pipeline faster
// than its last stage drains it.
func (s *Store) enqueueAdvance(ctx context.Context, worker int, b *advanceBuf, ts common.Ts) error {
	room := &s.advanceRoom[worker]
	n := len(b.subs)
	if err := room.acquire(ctx, s.closing, n, s.knobs.advanceWaits); err != nil {
		return err
	}
	ev := writeEvent{advance: b, resolved: ts}
	select {
	case s.queues[worker] <- ev:
		return nil
	case <-ctx.Done():
		room.release(n)
		return ctx.Err()
	case <-s.closing:
		room.release(n)
		return ErrClosed
	}
}

// advanceRoom counts the advances a write worker may still have queued:
// PushResolved takes room before it queues an event, the worker gives it
// back once it published the event.
type advanceRoom struct {
	mu struct {
		sync.Mutex
		free int
		// wake is closed and replaced when room is given back and someone
		// waits (watched).
		wake    chan struct{}
		watched bool
	}
}

func (r *advanceRoom) init(size int) {
	r.mu.free = size
	r.mu.wake = make(chan struct{})
}

// acquire takes room for n advances (n at most the size), waiting while
// there is not enough; it gives up when ctx ends or the store closes.
// waits, if set, runs before each wait (a test hook).
func (r *advanceRoom) acquire(ctx context.Context, closing <-chan struct{}, n int, waits func()) error {
	for {
		r.mu.Lock()
		if r.mu.free >= n {
			r.mu.free -= n
			r.mu.Unlock()
			return nil
		}
		r.mu.watched = true
		wake := r.mu.wake
		r.mu.Unlock()
		if waits != nil {
			waits()
		}
		select {
		case <-wake:
		case <-ctx.Done():
			return ctx.Err()
		case <-closing:
			return ErrClosed
		}
	}
}

// release gives back room for n advances.
func (r *advanceRoom) release(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.mu.free += n
	if r.mu.watched {
		close(r.mu.wake)
		r.mu.wake = make(chan struct{})
		r.mu.watched = false
	}
}

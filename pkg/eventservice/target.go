package eventservice

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/pendingset"
)

// resolvedValue is a dispatcher's pending resolved-ts advance. s is the
// session that produced it: the key (the dispatcher ID) can outlive a
// session through Reset, and even a dispatcher through Remove and a new
// Register of the same ID, possibly with the same epoch.
type resolvedValue struct {
	s     *session
	epoch uint64
	seq   uint64
	ts    common.Ts
}

// live reports whether v's session has not been retired.
func (v resolvedValue) live() bool {
	st, _ := v.s.sched.load()
	return st != stateRemoved
}

// newerResolved keeps the newer of two pending advances. Of two sessions,
// the live one wins (a retired session's owner may still add after the
// new session did), then the higher epoch; within a session, the higher ts
// (whose seq is at least as new).
func newerResolved(old, fresh resolvedValue) resolvedValue {
	if old.s != fresh.s {
		switch oldLive, freshLive := old.live(), fresh.live(); {
		case freshLive && !oldLive:
			return fresh
		case oldLive && !freshLive:
			return old
		case fresh.epoch >= old.epoch:
			return fresh
		default:
			return old
		}
	}
	if fresh.ts >= old.ts {
		return fresh
	}
	return old
}

// target is one downstream receiver. Its resolved-only progress goes
// through a coalescing pending set (latest ts per dispatcher wins) drained
// by a pump in batches, merged back on failure: a busy target delays its
// own resolved-ts, never another target's, and loses none.
type target struct {
	svc      *Service
	name     messaging.Target
	resolved *pendingset.Set[common.DispatcherID, resolvedValue]
	pump     *pendingset.Pump[common.DispatcherID, resolvedValue]
	started  bool
	// dispatchers counts the registered dispatchers of this target, under
	// Service.mu; the target is stopped and forgotten when it drops to 0,
	// so targets that come and go do not pile up pumps and metrics.
	dispatchers int
	// deliverMu is held by the pump from the filtering of a batch (live
	// sessions only) through its sends, so that Remove's fence, which
	// takes it once after retiring the session, waits for a delivery in
	// flight that may carry the removed registration's resolved-ts.
	deliverMu sync.Mutex
	// msgs (one message) and owners are deliver's scratch, under
	// deliverMu: a transport does not keep the slice it is handed (the
	// scan workers reuse theirs likewise), only the messages.
	msgs   []messaging.Message
	owners []int
	// room wakes refused senders when the target has room again; nil when
	// the transport cannot tell (then back-offs are timed).
	room *roomWatch
	// slabs keeps the memory of deliveries whose messages were all
	// released, for the next deliveries (slabs.go).
	slabs slabPool
	// chunk is the most entries one ResolvedBatch message carries:
	// ResolvedBatch capped at messaging.MaxResolvedBatchEntries, until the
	// target reports ErrBatchTooLarge, then halved until messages fit. Only
	// the pump's goroutine reads or writes it.
	chunk int
}

// targetLocked returns the target named name, creating it. REQUIRES:
// svc.mu held.
func (svc *Service) targetLocked(name messaging.Target) (*target, error) {
	if t, ok := svc.mu.targets[name]; ok {
		return t, nil
	}
	t := &target{svc: svc, name: name, chunk: min(svc.opts.ResolvedBatch, messaging.MaxResolvedBatchEntries)}
	t.slabs.size = svc.opts.ResolvedBatch
	set, err := pendingset.New(pendingset.Options[common.DispatcherID, resolvedValue]{
		Merge:         newerResolved,
		MaxBatch:      svc.opts.ResolvedBatch,
		BackoffBase:   svc.opts.BackoffBase,
		BackoffMax:    svc.opts.BackoffMax,
		Rand:          svc.opts.Rand,
		Clock:         svc.opts.Clock,
		Registerer:    svc.opts.Registerer,
		MetricsPrefix: namespace + "_" + subsystem + "_resolved_set",
		ConstLabels:   prometheus.Labels{"target": string(name)},
		Logger:        svc.log.Named("resolved"),
		// A new session's value must not wait out the old one's back-off.
		Bypass: func(waiting, fresh resolvedValue) bool { return fresh.s != waiting.s && fresh.live() },
	})
	if err != nil {
		return nil, fmt.Errorf("eventservice: target %q: %w", name, err)
	}
	t.resolved = set
	if rn, ok := svc.opts.Transport.(messaging.RoomNotifier); ok {
		t.room = newRoomWatch(rn)
	}
	if t.pump, err = pendingset.NewPump(set, t.deliver); err != nil {
		set.Unregister()
		return nil, fmt.Errorf("eventservice: target %q: %w", name, err)
	}
	svc.mu.targets[name] = t
	if svc.mu.started {
		if err := t.start(); err != nil {
			return nil, err
		}
	}
	return t, nil
}

func (t *target) start() error {
	if t.started {
		return nil
	}
	t.started = true
	if t.room != nil {
		t.room.start(t)
	}
	return t.pump.Start()
}

// stopWorkers stops the pump and the room watcher and waits for both.
func (t *target) stopWorkers() {
	t.pump.Stop()
	if t.room != nil && t.started {
		t.room.close()
	}
}

func (t *target) stop() {
	t.stopWorkers()
	t.resolved.Unregister()
}

// deliver sends one batch of resolved-ts advances, as ResolvedBatch
// messages of up to chunk entries each. Advances of a session that is no
// longer its dispatcher's current one are dropped: an older epoch's would
// be ignored by the collector, and a removed dispatcher's could be taken
// for progress of a new dispatcher registered under the same ID and epoch.
// A refusal or failure fails the whole batch: every key is kept, no budget
// is spent, and the pump backs off. A target that cannot take a message of
// chunk entries (ErrBatchTooLarge: a byte bound below it) gets smaller
// messages from then on, so a message it could never accept is not retried
// forever. When a later message of a batch is refused, the keys already
// accepted are delivered and the rest retry per key (RetryKey: no budget
// spent). Failing the whole batch instead would re-send the accepted keys
// first on every retry and could keep the others out of a small inbox
// indefinitely.
func (t *target) deliver(_ context.Context, batch []pendingset.Entry[common.DispatcherID, resolvedValue]) error {
	t.deliverMu.Lock()
	defer t.deliverMu.Unlock()
	owners := t.owners[:0] // entry j carries batch[owners[j]]
	defer func() {
		clear(t.msgs) // the receiver owns the message now; do not pin it
		t.owners = owners[:0]
	}()
	svc := t.svc
	for i := range batch {
		if batch[i].Value.current() {
			owners = append(owners, i)
		}
	}
	if len(owners) == 0 {
		return nil // every advance was a retired session's: nothing to send
	}
	// The batch's entries in one slab, which the messages share, not an
	// allocation each (slabs.go says why). The receiver holds them until it
	// released the last message, so a slab lives as long as its
	// longest-lived message, bounded by the target's inbox; then it is
	// reused (slabs.go).
	sl := t.slabs.get(len(owners))
	defer sl.Release() // the pump's hold: its sends are over
	slab := sl.entries
	for j, i := range owners {
		e := &batch[i]
		d := e.Value.s.d
		slab[j] = messaging.Resolved{
			Header: messaging.Header{Dispatcher: e.Key, Registration: d.reg, Epoch: e.Value.epoch, Seq: e.Value.seq},
			Ts:     e.Value.ts,
			Slot:   d.collectorSlot,
		}
	}
	if len(t.msgs) == 0 {
		t.msgs = make([]messaging.Message, 1)
	}
	// The sessions leave the set's keepalive exemption before the send
	// (a receiver may heartbeat before Send returns); if the send fails,
	// the set still holds them and a keepalive merely merges into it.
	wiredAt := svc.sinceBase(svc.opts.Clock.Now())
	for _, i := range owners {
		s := batch[i].Value.s
		s.inSet.Store(false)
		storeMaxInt64(&s.pubAt, wiredAt) // the acknowledgement is due an interval from now
	}
	for sent := 0; sent < len(slab); {
		n := min(t.chunk, len(slab)-sent)
		sl.hold() // the message's, before its receiver can release it
		t.msgs[0] = messaging.NewOwnedResolvedBatch(slab[sent:sent+n:sent+n], sl)
		err := svc.send(t.name, t.msgs)
		if err != nil {
			sl.Release() // a refused send delivered nothing (Transport: all or nothing)
		}
		switch {
		case err == nil:
			sent += n
		case errors.Is(err, messaging.ErrBatchTooLarge) && n > 1:
			t.chunk = n / 2
			svc.log.Warn("target cannot take a whole resolved-ts batch; sending smaller batches",
				zap.String("target", string(t.name)), zap.Int("batch", t.chunk), zap.Error(err))
		case sent == 0:
			return t.refused(err) // nothing accepted: the whole batch failed
		default:
			for _, i := range owners[sent:] {
				batch[i].Result = pendingset.RetryKey
			}
			_ = t.refused(err)
			return nil
		}
	}
	return nil
}

// refused handles a refused resolved-ts send: a busy target is routine
// back-pressure (pendingset.ErrBusy: logged at debug), and the pump is
// woken when the target has room again.
func (t *target) refused(err error) error {
	if !errors.Is(err, messaging.ErrBusy) {
		return err
	}
	if t.room != nil {
		t.room.ring()
	}
	return fmt.Errorf("%w: %w", pendingset.ErrBusy, err)
}

// current reports whether v was produced by the current, live session of
// its dispatcher. No map lookup is needed: a removed dispatcher's sessions
// are all retired (not live), and a later registration of the same ID is
// another dispatcher, whose sessions v.s is not.
func (v resolvedValue) current() bool {
	return v.s.d.session.Load() == v.s && v.live()
}

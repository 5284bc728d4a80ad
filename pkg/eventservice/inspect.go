package eventservice

import (
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// Stats is a snapshot of the service's state, for tests, the demo server's
// progress line and the metrics (metrics.go).
type Stats struct {
	// Progress holds the counters that cost O(workers): notifications,
	// coalesced ones, pending tasks, resets and scanned rows and bytes.
	Progress
	Dispatchers   int
	SchemaBlocked int
	BackingOff    int
	// States counts dispatchers by scan state.
	States [numStates]int
	// MinReceived and MinSent are the smallest received (from the store)
	// and sent (downstream) resolved-ts over dispatchers; zero when none.
	MinReceived, MinSent common.Ts
}

// Stats returns a snapshot; it walks every dispatcher once (O(n)).
func (svc *Service) Stats() Stats {
	st := Stats{Progress: svc.Progress()}
	st.SchemaBlocked = svc.blocked.len()
	w := svc.walk()
	st.Dispatchers, st.States, st.MinReceived, st.MinSent = w.dispatchers, w.states, w.minReceived, w.minSent
	st.BackingOff = st.States[stateBackingOff]
	return st
}

// Progress is a cheap snapshot (no walk over dispatchers) for a progress
// line sampled often.
type Progress struct {
	// Dispatchers is the number registered.
	Dispatchers                 int
	Notifications, Coalesced    uint64
	PendingPrepare, PendingScan int
	Resets                      uint64
	ScannedRows, ScannedBytes   uint64
}

// Progress returns the counters of Stats that cost O(workers), not
// O(dispatchers).
func (svc *Service) Progress() Progress {
	var p Progress
	for i := range svc.counters {
		p.Notifications += svc.counters[i].notifications.Load()
		p.Coalesced += svc.counters[i].coalesced.Load()
	}
	for _, q := range svc.prepQueues {
		p.PendingPrepare += q.len()
	}
	p.PendingScan = int(svc.scanPending.Load())
	p.Resets = svc.resets.Load()
	p.ScannedRows, p.ScannedBytes = svc.scannedRows.Load(), svc.scannedBytes.Load()
	svc.mu.RLock()
	p.Dispatchers = svc.mu.dispatchers.Len()
	svc.mu.RUnlock()
	return p
}

// DispatcherSnapshot describes one dispatcher for diagnostics.
type DispatcherSnapshot struct {
	Registration messaging.RegistrationID
	Epoch        uint64
	StartTs      common.Ts
	State        string
	Pending      bool
	Queued       bool
	Received     common.Ts // largest resolved-ts notified by the store
	MaxCommit    common.Ts
	Sent         common.Ts // progress published downstream
	BlockedAt    common.Ts
	NeedsStore   bool // a reset's store re-registration is outstanding
	Checkpoint   common.Ts
	StoreStart   common.Ts
}

// Inspect returns a snapshot of the registration of dispatcher id.
func (svc *Service) Inspect(id common.DispatcherID) (DispatcherSnapshot, error) {
	d, err := svc.lookupID(id)
	if err != nil {
		return DispatcherSnapshot{}, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	s := d.session.Load()
	st, pending := s.sched.load()
	return DispatcherSnapshot{Registration: d.reg, Epoch: s.epoch, StartTs: s.own.startTs, State: st.String(), Pending: pending,
		Queued: svc.prepQueues[d.worker].contains(s), Received: common.Ts(d.received.Load()),
		MaxCommit: common.Ts(d.maxCommit.Load()), Sent: common.Ts(s.sent.Load()), BlockedAt: common.Ts(s.blockedAt.Load()),
		NeedsStore: d.mu.needRegister, Checkpoint: d.mu.checkpoint, StoreStart: d.mu.storeStart}, nil
}

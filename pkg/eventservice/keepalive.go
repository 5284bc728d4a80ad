package eventservice

import (
	"time"

	"github.com/cdcflow/eventservice/pkg/clock"
)

// runKeepalive re-sends, every SignalInterval, the published progress of
// dispatchers whose collector has not acknowledged it by heartbeat for a
// whole interval. If the last message of a dispatcher was dropped, no later
// message would ever reveal the seq gap and the collector would wait
// forever: the keepalive's resolved-ts carries the current seq, the
// collector sees the gap and resets. Acknowledged dispatchers cost one
// comparison per interval.
func (svc *Service) runKeepalive(t clock.Ticker) {
	defer t.Stop()
	var ds []*dispatcher
	for {
		select {
		case <-t.C():
		case <-svc.closing:
			return
		}
		ds = svc.snapshotDispatchers(ds[:0])
		now := svc.opts.Clock.Now()
		for _, d := range ds {
			svc.keepalive(d, now)
		}
		clear(ds)
	}
}

func (svc *Service) snapshotDispatchers(dst []*dispatcher) []*dispatcher {
	svc.mu.RLock()
	defer svc.mu.RUnlock()
	for _, d := range svc.mu.dispatchers {
		dst = append(dst, d)
	}
	return dst
}

// keepalive re-sends d's published progress if it is unacknowledged and
// older than SignalInterval.
func (svc *Service) keepalive(d *dispatcher, now time.Time) {
	s := d.session.Load()
	ts, seq, at := s.published()
	if seq == 0 || now.Sub(at) < svc.opts.SignalInterval {
		return
	}
	d.mu.Lock()
	acked := d.mu.checkpoint >= ts && !d.mu.needRegister
	d.mu.Unlock()
	if acked {
		return
	}
	if st, _ := s.sched.load(); st == stateRemoved {
		return
	}
	s.touch(now)
	svc.metrics.keepalives.Inc()
	d.target.resolved.Add(d.id, resolvedValue{s: s, epoch: s.epoch, seq: seq, ts: ts})
}

package tests

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// switchTransportForTest wraps a transport with faults a test switches on and
// off: an outage (every send refused with ErrBusy, or failed), the silent
// loss of the next message of chosen dispatchers, and a send held in
// flight.
type switchTransportForTest struct {
	inner messaging.Transport

	mu struct {
		sync.Mutex
		outage error
		drop   map[common.DispatcherID]bool
		// hold, if set, is the dispatcher whose next send is held until
		// release is closed; held is closed when it is.
		hold          common.DispatcherID
		held, release chan struct{}
		// counters
		refused, dropped int
		// refusedCh is closed and replaced at the next refusal once
		// watched (waitRefused took it).
		refusedCh chan struct{}
		watched   bool
	}
}

func newSwitchTransportForTest(inner messaging.Transport) *switchTransportForTest {
	s := &switchTransportForTest{inner: inner}
	s.mu.drop = map[common.DispatcherID]bool{}
	s.mu.refusedCh = make(chan struct{})
	return s
}

// setOutage makes every send fail with err until called with nil.
func (s *switchTransportForTest) setOutage(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.outage = err
}

// dropNext silently loses the next message sent to dispatcher id.
func (s *switchTransportForTest) dropNext(id common.DispatcherID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.drop[id] = true
}

// holdNext holds the next send carrying a message of id (before it reaches
// the inner transport) until the returned release is called; held is
// closed once a send is held.
func (s *switchTransportForTest) holdNext(id common.DispatcherID) (held <-chan struct{}, release func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.hold, s.mu.held, s.mu.release = id, make(chan struct{}), make(chan struct{})
	rel := s.mu.release
	var once sync.Once
	return s.mu.held, func() { once.Do(func() { close(rel) }) }
}

// holdLocked reports, and disarms, a hold that msgs trigger.
// REQUIRES: s.mu held.
func (s *switchTransportForTest) holdLocked(msgs []messaging.Message) (held, release chan struct{}) {
	if s.mu.hold.IsZero() {
		return nil, nil
	}
	for _, m := range msgs {
		if m.MessageHeader().Dispatcher == s.mu.hold {
			held, release = s.mu.held, s.mu.release
			s.mu.hold, s.mu.held, s.mu.release = common.DispatcherID{}, nil, nil
			return held, release
		}
	}
	return nil, nil
}

func (s *switchTransportForTest) counts() (refused, dropped int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.refused, s.mu.dropped
}

// waitRefused returns once more than n sends were refused, checking at
// every refusal, or fails t after timeout (a hang guard only: no event is
// ordered by time).
func (s *switchTransportForTest) waitRefused(t *testing.T, timeout time.Duration, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for {
		s.mu.Lock()
		if s.mu.refused > n {
			s.mu.Unlock()
			return
		}
		s.mu.watched = true
		ch := s.mu.refusedCh
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			t.Fatalf("timed out after %v waiting for more than %d refused sends", timeout, n)
		}
	}
}

// Send implements messaging.Transport. A dropped message is removed from
// the batch and the rest forwarded; the caller is told the whole batch was
// accepted, as a lossy network would.
func (s *switchTransportForTest) Send(target messaging.Target, msgs []messaging.Message) error {
	s.mu.Lock()
	if err := s.mu.outage; err != nil {
		s.mu.refused++
		if s.mu.watched {
			close(s.mu.refusedCh)
			s.mu.refusedCh, s.mu.watched = make(chan struct{}), false
		}
		s.mu.Unlock()
		return err
	}
	if held, release := s.holdLocked(msgs); held != nil {
		s.mu.Unlock()
		close(held)
		<-release
		s.mu.Lock()
	}
	keep := msgs
	if len(s.mu.drop) > 0 {
		keep = make([]messaging.Message, 0, len(msgs))
		for _, m := range msgs {
			if id := m.MessageHeader().Dispatcher; s.mu.drop[id] {
				delete(s.mu.drop, id)
				s.mu.dropped++
				continue
			}
			keep = append(keep, m)
		}
	}
	s.mu.Unlock()
	if len(keep) == 0 {
		return nil
	}
	return s.inner.Send(target, keep)
}

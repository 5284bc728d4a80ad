package tests

import (
	"sync"
	"time"

	"github.com/cdcflow/eventservice/internal/clock"
	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
	"github.com/cdcflow/eventservice/pkg/upstream"
)

// switchTransportForTest wraps a transport with faults a test switches on and
// off: an outage (every send refused with ErrBusy, or failed) and the
// silent loss of the next message of chosen dispatchers.
type switchTransportForTest struct {
	inner messaging.Transport

	mu struct {
		sync.Mutex
		outage error
		drop   map[common.DispatcherID]bool
		// counters
		refused, dropped int
	}
}

func newSwitchTransportForTest(inner messaging.Transport) *switchTransportForTest {
	s := &switchTransportForTest{inner: inner}
	s.mu.drop = map[common.DispatcherID]bool{}
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

func (s *switchTransportForTest) counts() (refused, dropped int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mu.refused, s.mu.dropped
}

// Send implements messaging.Transport. A dropped message is removed from
// the batch and the rest forwarded; the caller is told the whole batch was
// accepted, as a lossy network would.
func (s *switchTransportForTest) Send(target messaging.Target, msgs []messaging.Message) error {
	s.mu.Lock()
	if err := s.mu.outage; err != nil {
		s.mu.refused++
		s.mu.Unlock()
		return err
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

// genClock adapts the fake clock to upstream.Clock, so a test moves the
// generator's frontier by advancing time.
type genClock struct{ *clock.Fake }

func (c genClock) NewTicker(d time.Duration) upstream.Ticker { return c.Fake.NewTicker(d) }

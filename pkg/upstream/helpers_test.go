package upstream

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
)

// waitTimeout only turns a hang into a failure; no test waits on time for
// synchronisation.
const waitTimeout = 20 * time.Second

// t0 is a tick-aligned wall-clock instant the tests start from.
var t0 = time.UnixMilli(1_700_000_000_000)

// recordingSinkForTest is an eventstore.Sink test double that records every
// accepted batch. pushHook, if set (before use), runs first; when it returns
// an error the batch is not recorded.
type recordingSinkForTest struct {
	pushHook func(ctx context.Context, b eventstore.Batch) error
	calls    atomic.Int64

	mu struct {
		sync.Mutex
		batches []eventstore.Batch
		changed chan struct{}
	}
}

func newRecordingSinkForTest() *recordingSinkForTest {
	s := &recordingSinkForTest{}
	s.mu.changed = make(chan struct{})
	return s
}

func (s *recordingSinkForTest) Push(ctx context.Context, b eventstore.Batch) error {
	s.calls.Add(1)
	if s.pushHook != nil {
		if err := s.pushHook(ctx, b); err != nil {
			return err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.mu.batches = append(s.mu.batches, b)
	close(s.mu.changed)
	s.mu.changed = make(chan struct{})
	return nil
}

func (s *recordingSinkForTest) batches() []eventstore.Batch {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.mu.batches)
}

func (s *recordingSinkForTest) rows() []common.Row {
	var out []common.Row
	for _, b := range s.batches() {
		out = append(out, b.Rows...)
	}
	return out
}

// resolved returns the last non-zero resolved-ts received.
func (s *recordingSinkForTest) resolved() common.Ts {
	var r common.Ts
	for _, b := range s.batches() {
		if b.ResolvedTs != 0 {
			r = b.ResolvedTs
		}
	}
	return r
}

// waitResolved blocks until the sink has received resolved-ts >= ts.
func (s *recordingSinkForTest) waitResolved(t *testing.T, ts common.Ts) {
	t.Helper()
	timeout := time.After(waitTimeout)
	for {
		s.mu.Lock()
		changed := s.mu.changed
		s.mu.Unlock()
		if s.resolved() >= ts {
			return
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("timed out waiting for resolved-ts %v; have %v", ts, s.resolved())
		}
	}
}

// holdOnceSinkForTest is a recording sink whose first push that match
// accepts blocks until its context is cancelled: entered is closed when it
// blocks, and cancelled receives the context's error when it returns it.
// Every other push goes through.
func holdOnceSinkForTest(match func(eventstore.Batch) bool) (s *recordingSinkForTest, entered <-chan struct{}, cancelled <-chan error) {
	in := make(chan struct{})
	out := make(chan error, 1)
	var once sync.Once
	s = newRecordingSinkForTest()
	s.pushHook = func(ctx context.Context, b eventstore.Batch) error {
		if !match(b) {
			return nil
		}
		hold := false
		once.Do(func() { hold = true })
		if !hold {
			return nil
		}
		close(in)
		<-ctx.Done()
		out <- ctx.Err()
		return ctx.Err()
	}
	return s, in, out
}

// passWatcherForTest observes the generator's driver passes without ever
// blocking it.
type passWatcherForTest struct {
	mu struct {
		sync.Mutex
		last    passInfo
		passes  int
		changed chan struct{}
	}
}

func watchPasses(g *Generator) *passWatcherForTest {
	w := &passWatcherForTest{}
	w.mu.changed = make(chan struct{})
	g.knobs.pass = w.hook
	return w
}

func (w *passWatcherForTest) hook(info passInfo) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.mu.last = info
	w.mu.passes++
	close(w.mu.changed)
	w.mu.changed = make(chan struct{})
}

func (w *passWatcherForTest) passes() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.mu.passes
}

// waitIdle blocks until a pass after the first `after` passes reached
// frontier f with no work left.
func (w *passWatcherForTest) waitIdle(t *testing.T, after int, f common.Ts) {
	t.Helper()
	timeout := time.After(waitTimeout)
	for {
		w.mu.Lock()
		last, passes, changed := w.mu.last, w.mu.passes, w.mu.changed
		w.mu.Unlock()
		if passes > after && last.frontier == f && !last.more {
			return
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("timed out waiting for an idle pass at %v; last %+v after %d passes", f, last, passes)
		}
	}
}

// frontierAt is the generator frontier for wall time now with tick d.
func frontierAt(now time.Time, d time.Duration) common.Ts {
	ms := d.Milliseconds()
	return common.ComposeTs(now.UnixMilli()/ms*ms, 0) - 1
}

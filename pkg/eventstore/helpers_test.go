package eventstore

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/cdcflow/eventservice/pkg/clock"
	"github.com/cdcflow/eventservice/pkg/common"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeUpstreamForTest records subscriptions and lets a test push into their
// sinks directly. It is the edge the store's tests are about.
type fakeUpstreamForTest struct {
	mu struct {
		sync.Mutex
		subs   []*fakeSubForTest
		failOn error
	}
}

type fakeSubForTest struct {
	span    common.Span
	startTs common.Ts
	sink    Sink
	mu      sync.Mutex
	closed  bool
}

func (f *fakeUpstreamForTest) Subscribe(span common.Span, startTs common.Ts, sink Sink) (Subscription, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.mu.failOn != nil {
		return nil, f.mu.failOn
	}
	s := &fakeSubForTest{span: span, startTs: startTs, sink: sink}
	f.mu.subs = append(f.mu.subs, s)
	return s, nil
}

func (s *fakeSubForTest) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
}

func (s *fakeSubForTest) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// subs returns the subscriptions made so far.
func (f *fakeUpstreamForTest) subs() []*fakeSubForTest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*fakeSubForTest(nil), f.mu.subs...)
}

// last returns the newest subscription of span.
func (f *fakeUpstreamForTest) last(t *testing.T, span common.Span) *fakeSubForTest {
	t.Helper()
	subs := f.subs()
	for i := len(subs) - 1; i >= 0; i-- {
		if subs[i].span.Equal(span) {
			return subs[i]
		}
	}
	t.Fatalf("no subscription of %v", span)
	return nil
}

// testEnv is a started store on a fake upstream and a fake clock whose
// maintenance loop never fires by itself (tests call maintain directly).
type testEnv struct {
	store *Store
	up    *fakeUpstreamForTest
	clk   *clock.Fake
}

// newTestEnv starts a store on a fake clock; hooks, if given, run on it
// before Start (to set test hooks).
func newTestEnv(t *testing.T, tweak func(*Options), hooks ...func(*Store)) *testEnv {
	t.Helper()
	env := &testEnv{up: &fakeUpstreamForTest{}, clk: clock.NewFake(time.UnixMilli(1_700_000_000_000))}
	opts := Options{Upstream: env.up, Clock: env.clk, MaintenanceInterval: time.Hour, IdleTTL: time.Second}
	if tweak != nil {
		tweak(&opts)
	}
	s, err := Open(opts)
	require.NoError(t, err)
	for _, h := range hooks {
		h(s)
	}
	require.NoError(t, s.Start())
	env.store = s
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	return env
}

// notification is one notifier call.
type notification struct{ resolved, maxCommit common.Ts }

// recorder is a notifier that forwards every call on a channel.
type recorder struct{ ch chan notification }

func newRecorder() *recorder { return &recorder{ch: make(chan notification, 1024)} }

func (r *recorder) Notify(resolved, maxCommit common.Ts) {
	r.ch <- notification{resolved, maxCommit}
}

// next waits for the next notification.
func (r *recorder) next(t *testing.T) notification {
	t.Helper()
	select {
	case n := <-r.ch:
		return n
	case <-time.After(10 * time.Second):
		t.Fatal("no notification within 10s")
		return notification{}
	}
}

// none asserts no notification is pending.
func (r *recorder) none(t *testing.T) {
	t.Helper()
	select {
	case n := <-r.ch:
		t.Fatalf("unexpected notification %+v", n)
	default:
	}
}

// waitResolved drains notifications until resolved reaches ts.
func (r *recorder) waitResolved(t *testing.T, ts common.Ts) notification {
	t.Helper()
	for {
		n := r.next(t)
		if n.resolved >= ts {
			return n
		}
	}
}

func push(t *testing.T, s *fakeSubForTest, resolved common.Ts, rows ...common.Row) {
	t.Helper()
	require.NoError(t, s.sink.Push(context.Background(), Batch{Rows: rows, ResolvedTs: resolved}))
}

func put(key string, startTs, commitTs common.Ts) common.Row {
	return common.Row{Op: common.OpPut, Key: []byte(key), Value: []byte("v-" + key), StartTs: startTs, CommitTs: commitTs}
}

func did(n uint64) common.DispatcherID { return common.DispatcherIDFromUint64(n) }

// scan reads every row of r for dispatcher id, recording txn starts.
func scan(t *testing.T, s *Store, id common.DispatcherID, r ScanRange) (rows []common.Row, txnStarts []int) {
	t.Helper()
	it, err := s.NewIterator(id, r)
	require.NoError(t, err)
	defer func() { require.NoError(t, it.Close()) }()
	for it.Next() {
		if it.NewTxn() {
			txnStarts = append(txnStarts, len(rows))
		}
		rows = append(rows, it.Row().Clone())
	}
	require.NoError(t, it.Err())
	return rows, txnStarts
}

func keysOf(rows []common.Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = string(r.Key)
	}
	return out
}

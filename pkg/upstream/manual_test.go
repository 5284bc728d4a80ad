package upstream

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/eventstore"
)

func testRows(commit common.Ts) []common.Row {
	return []common.Row{
		{Op: common.OpPut, Key: []byte("a"), Value: []byte("1"), StartTs: commit - 1, CommitTs: commit},
		{Op: common.OpDelete, Key: []byte("b"), StartTs: commit - 1, CommitTs: commit},
	}
}

func TestManualPushRoutesBySpan(t *testing.T) {
	ctx := context.Background()
	m := NewManual()
	spanA := common.TableSpan(1)
	spanB := common.Span{TableID: 1, StartKey: []byte("a"), EndKey: []byte("m")}
	a1, a2, b := newRecordingSinkForTest(), newRecordingSinkForTest(), newRecordingSinkForTest()
	subA1, err := m.Subscribe(spanA, 10, a1)
	require.NoError(t, err)
	_, err = m.Subscribe(spanA, 20, a2)
	require.NoError(t, err)
	_, err = m.Subscribe(spanB, 10, b)
	require.NoError(t, err)
	require.Zero(t, a1.calls.Load()+a2.calls.Load()+b.calls.Load(), "Subscribe must not call the sink")

	batch := eventstore.Batch{Rows: testRows(30), ResolvedTs: 30}
	require.NoError(t, m.Push(ctx, spanA, batch))
	require.Equal(t, []eventstore.Batch{batch}, a1.batches())
	require.Equal(t, []eventstore.Batch{batch}, a2.batches())
	require.Empty(t, b.batches())

	// Each sink owns its own copy.
	a1.batches()[0].Rows[0].Key[0] = 'z'
	require.Equal(t, []byte("a"), a2.batches()[0].Rows[0].Key)
	require.Equal(t, []byte("a"), batch.Rows[0].Key)

	require.NoError(t, m.Push(ctx, spanB, eventstore.Batch{ResolvedTs: 40}))
	require.Equal(t, common.Ts(40), b.resolved())

	require.Equal(t, []SubscriptionInfo{
		{ID: 1, Span: spanA, StartTs: 10, Live: true},
		{ID: 2, Span: spanA, StartTs: 20, Live: true},
		{ID: 3, Span: spanB, StartTs: 10, Live: true},
	}, m.Subscriptions())
	require.Equal(t, 2, m.SubscribeCount(spanA))
	require.Equal(t, 1, m.SubscribeCount(spanB))

	subA1.Close()
	require.NoError(t, m.Push(ctx, spanA, batch))
	require.Len(t, a1.batches(), 1, "closed subscription still fed")
	require.Len(t, a2.batches(), 2)
	require.False(t, m.Subscriptions()[0].Live)
	require.Equal(t, 2, m.SubscribeCount(spanA), "count includes closed subscriptions")
}

func TestManualNoSubscription(t *testing.T) {
	ctx := context.Background()
	m := NewManual()
	err := m.Push(ctx, common.TableSpan(9), eventstore.Batch{ResolvedTs: 1})
	require.ErrorIs(t, err, ErrNoSubscription)

	sub, err := m.Subscribe(common.TableSpan(9), 0, newRecordingSinkForTest())
	require.NoError(t, err)
	require.NoError(t, m.Push(ctx, common.TableSpan(9), eventstore.Batch{ResolvedTs: 1}))
	sub.Close()
	sub.Close() // idempotent
	require.ErrorIs(t, m.Push(ctx, common.TableSpan(9), eventstore.Batch{ResolvedTs: 2}), ErrNoSubscription)
}

func TestManualSinkErrorIsReturned(t *testing.T) {
	errBoom := errors.New("boom")
	m := NewManual()
	sink := newRecordingSinkForTest()
	sink.pushHook = func(context.Context, eventstore.Batch) error { return errBoom }
	_, err := m.Subscribe(common.TableSpan(1), 0, sink)
	require.NoError(t, err)
	err = m.Push(context.Background(), common.TableSpan(1), eventstore.Batch{ResolvedTs: 1})
	require.ErrorIs(t, err, errBoom)
	require.NotErrorIs(t, err, ErrNoSubscription)
}

func TestManualSubscribeErrHook(t *testing.T) {
	errBoom := errors.New("subscribe refused")
	m := NewManual()
	m.SetSubscribeErr(errBoom)
	sub, err := m.Subscribe(common.TableSpan(1), 0, newRecordingSinkForTest())
	require.ErrorIs(t, err, errBoom)
	require.Nil(t, sub)
	require.Zero(t, m.SubscribeCount(common.TableSpan(1)))
	require.Empty(t, m.Subscriptions())

	m.SetSubscribeErr(nil)
	_, err = m.Subscribe(common.TableSpan(1), 0, newRecordingSinkForTest())
	require.NoError(t, err)
	require.Equal(t, 1, m.SubscribeCount(common.TableSpan(1)))
}

func TestManualInvalidArguments(t *testing.T) {
	m := NewManual()
	_, err := m.Subscribe(common.TableSpan(1), 0, nil)
	require.ErrorIs(t, err, ErrInvalidArgument)
	_, err = m.Subscribe(common.Span{TableID: 1, StartKey: []byte("b"), EndKey: []byte("a")}, 0, newRecordingSinkForTest())
	require.ErrorIs(t, err, ErrInvalidArgument)
	require.ErrorIs(t, err, common.ErrInvalidSpan)
}

func TestManualWaitLive(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	m := NewManual()
	span := common.TableSpan(5)
	changed := m.Changed()
	subs := make(chan eventstore.Subscription)
	go func() {
		sub, err := m.Subscribe(span, 0, newRecordingSinkForTest())
		if err != nil {
			panic(err)
		}
		subs <- sub
	}()
	require.NoError(t, m.WaitLive(ctx, span, 1))
	<-changed // closed by the create
	sub := <-subs
	go sub.Close()
	require.NoError(t, m.WaitLive(ctx, span, 0))

	cancelled, cancelNow := context.WithCancel(context.Background())
	cancelNow()
	require.ErrorIs(t, m.WaitLive(cancelled, span, 3), context.Canceled)
}

// TestManualCloseWhilePushBlocks: Close cancels the in-flight Push through
// its context and returns once the sink has returned.
func TestManualCloseWhilePushBlocks(t *testing.T) {
	m := NewManual()
	span := common.TableSpan(1)
	entered := make(chan struct{})
	sink := newRecordingSinkForTest()
	sink.pushHook = func(ctx context.Context, _ eventstore.Batch) error {
		close(entered)
		<-ctx.Done()
		return ctx.Err()
	}
	sub, err := m.Subscribe(span, 0, sink)
	require.NoError(t, err)
	pushErr := make(chan error, 1)
	go func() { pushErr <- m.Push(context.Background(), span, eventstore.Batch{ResolvedTs: 1}) }()
	<-entered
	sub.Close()
	require.ErrorIs(t, <-pushErr, context.Canceled)
	require.Equal(t, int64(1), sink.calls.Load())
}

// TestManualCloseRacesPush hammers Push from several goroutines while Close
// runs: once Close has returned, the sink must never be entered again.
func TestManualCloseRacesPush(t *testing.T) {
	m := NewManual()
	span := common.TableSpan(1)
	var closed atomic.Bool
	var late atomic.Int64
	busy := make(chan struct{})
	var once sync.Once
	sink := newRecordingSinkForTest()
	sink.pushHook = func(context.Context, eventstore.Batch) error {
		if closed.Load() {
			late.Add(1)
		}
		once.Do(func() { close(busy) })
		return nil
	}
	sub, err := m.Subscribe(span, 0, sink)
	require.NoError(t, err)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				_ = m.Push(context.Background(), span, eventstore.Batch{ResolvedTs: 1})
			}
		})
	}
	<-busy // the pushers are running
	sub.Close()
	closed.Store(true)
	close(stop)
	wg.Wait()
	require.Zero(t, late.Load(), "sink called after Close returned")
}

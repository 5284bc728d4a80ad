package eventstore

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
)

// quietUpstreamForTest subscribes without allocating and never pushes.
type quietUpstreamForTest struct{}

type quietSubscriptionForTest struct{}

func (quietSubscriptionForTest) Close() {}

func (quietUpstreamForTest) Subscribe(common.Span, common.Ts, Sink) (Subscription, error) {
	return quietSubscriptionForTest{}, nil
}

// TestARegistrationOfItsOwnSpanIsOneObject: a dispatcher that subscribes
// a whole table no one else reads costs the store one object (the
// subscription with its first subscriber inside: no key string, no
// subscriber list, no boxed sink, no second index), map growth aside; a
// dispatcher that shares the span costs one more (its subscriber). At a
// million dispatchers each object is one more for every GC cycle to mark.
func TestARegistrationOfItsOwnSpanIsOneObject(t *testing.T) {
	env := newTestEnv(t, func(o *Options) { o.Upstream = quietUpstreamForTest{} })
	notify := func(common.Ts, common.Ts) {}
	n := uint64(0)
	allocs := testing.AllocsPerRun(500, func() {
		n++
		if err := env.store.RegisterDispatcher(did(n), common.TableSpan(int64(n)), 1, NotifierFunc(notify)); err != nil {
			panic(err)
		}
	})
	require.LessOrEqual(t, allocs, 1.0)
	shared := n
	allocs = testing.AllocsPerRun(500, func() {
		n++
		if err := env.store.RegisterDispatcher(did(n), common.TableSpan(int64(shared)), 1, NotifierFunc(notify)); err != nil {
			panic(err)
		}
	})
	require.LessOrEqual(t, allocs, 2.0, "a shared span: the subscriber and the subscriber list it replaces")
	st, err := env.store.Dispatcher(did(n))
	require.NoError(t, err)
	first, err := env.store.Dispatcher(did(shared))
	require.NoError(t, err)
	require.Equal(t, first.SubscriptionID, st.SubscriptionID, "shared, not subscribed again")
}

// TestASubscriptionAndItsFirstSubscriberFitTheirSizeClass: the object a
// registration of its own span allocates stays within the 320-byte size
// class (its span packed, its sink the subscription itself, its small
// fields sharing a word: it was 384 before, 64 MB at a million
// dispatchers).
func TestASubscriptionAndItsFirstSubscriberFitTheirSizeClass(t *testing.T) {
	require.LessOrEqual(t, unsafe.Sizeof(subscriptionWithFirst{}), uintptr(320))
}

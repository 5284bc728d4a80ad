package eventservice

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/cdcflow/eventservice/pkg/common"
	"github.com/cdcflow/eventservice/pkg/messaging"
)

// TestASlabReturnsToItsPoolOnlyWhenEveryHolderReleased: the pump's hold
// and each accepted message's keep a slab out of the pool; the last
// release returns it, a later get of no more entries reuses it, a larger
// one does not, the pool keeps at most maxPooledSlabs, and a release
// without a hold is a bug that panics rather than hands the memory out
// twice.
func TestASlabReturnsToItsPoolOnlyWhenEveryHolderReleased(t *testing.T) {
	var p slabPool
	s := p.get(3)
	require.Len(t, s.entries, 3)
	s.hold() // two messages
	s.hold()
	s.Release() // the pump's
	s.Release()
	require.Empty(t, p.free, "a message still holds it")
	s.Release()
	require.Len(t, p.free, 1, "the last release pools it")

	again := p.get(2)
	require.Same(t, s, again, "reused for fewer entries")
	require.Len(t, again.entries, 2)
	require.Empty(t, p.free)
	again.Release()
	bigger := p.get(4)
	require.NotSame(t, s, bigger, "too small for four entries")
	require.Len(t, p.free, 1, "the small one stays pooled")

	held := make([]*resolvedSlab, maxPooledSlabs+4)
	for i := range held {
		held[i] = p.get(8) // none pooled is that large: all fresh
	}
	for _, s := range held {
		s.Release()
	}
	require.Len(t, p.free, maxPooledSlabs, "a burst of releases keeps at most maxPooledSlabs")
	require.Panics(t, func() { bigger.Release(); bigger.Release() }, "released more often than held")
}

// recordingTransportForTest accepts every send and hands the messages to
// the test, which decides when a receiver is done with them (the
// transport and the receiver are the edge this test is about).
type recordingTransportForTest struct{ msgs chan messaging.Message }

func (r recordingTransportForTest) Send(_ messaging.Target, msgs []messaging.Message) error {
	for _, m := range msgs {
		r.msgs <- m
	}
	return nil
}

// nextBatch returns the next ResolvedBatch sent, skipping the handshake.
func (r recordingTransportForTest) nextBatch(t *testing.T) *messaging.ResolvedBatch {
	t.Helper()
	for {
		select {
		case m := <-r.msgs:
			if b, ok := m.(*messaging.ResolvedBatch); ok {
				return b
			}
		case <-time.After(10 * time.Second):
			t.Fatal("no resolved-ts batch sent")
		}
	}
}

// TestADeliveryReusesEntriesOnlyOnceTheirReceiverReleasedThem: the
// entries of a batch its receiver has not released are never written by a
// later delivery (the receiver may still be reading them), and once every
// batch of a slab is released the next delivery writes into that memory
// instead of allocating.
func TestADeliveryReusesEntriesOnlyOnceTheirReceiverReleasedThem(t *testing.T) {
	rec := recordingTransportForTest{msgs: make(chan messaging.Message, 64)}
	h := newHarness(t, func(o *Options) {
		o.Transport = rec
		o.SignalInterval = time.Hour // no keepalive re-sends: every batch is an advance's
	}, hooks{})
	h.advanceSchema(1 << 40)
	id := common.DispatcherIDFromUint64(1)
	require.NoError(t, h.registerOn(id, 1, 10, "rec"))

	h.push(1, 20)
	b1 := rec.nextBatch(t)
	require.Equal(t, common.Ts(20), b1.Entries[0].Ts)
	first := &b1.Entries[0]

	h.push(1, 30)
	b2 := rec.nextBatch(t)
	require.Equal(t, common.Ts(30), b2.Entries[0].Ts)
	require.NotSame(t, first, &b2.Entries[0], "b1 is not released: its memory is not reused")
	require.Equal(t, common.Ts(20), first.Ts, "and not overwritten")
	second := &b2.Entries[0]

	b1.Release()
	b2.Release()
	require.Empty(t, b1.Entries, "a released batch shows no entries")
	h.push(1, 40)
	b3 := rec.nextBatch(t)
	require.Equal(t, common.Ts(40), b3.Entries[0].Ts)
	reused := &b3.Entries[0] == first || &b3.Entries[0] == second
	require.True(t, reused, "a released slab is reused")
	b3.Release()
}

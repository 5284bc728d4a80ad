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
// one does not; a release without a hold is a bug that panics rather than
// hands the memory out twice.
func TestASlabReturnsToItsPoolOnlyWhenEveryHolderReleased(t *testing.T) {
	p := slabPool{size: 8}
	s := p.get(3)
	require.Len(t, s.entries, 3)
	require.Equal(t, 3, cap(s.entries), "nothing released yet: made for its delivery only")
	s.hold() // two messages
	s.hold()
	s.Release() // the pump's
	s.Release()
	require.Empty(t, p.mu.free, "a message still holds it")
	s.Release()
	require.Len(t, p.mu.free, 1, "the last release pools it")

	again := p.get(2)
	require.Same(t, s, again, "reused for fewer entries")
	require.Len(t, again.entries, 2)
	require.Empty(t, p.mu.free)
	again.Release()
	bigger := p.get(4)
	require.NotSame(t, s, bigger, "too small for four entries")
	require.Equal(t, 8, cap(bigger.entries), "the receiver releases: new slabs are made full size")
	require.Len(t, p.mu.free, 1, "the small one stays pooled")
	bigger.Release()
	require.Panics(t, func() { bigger.Release() }, "released more often than held")
}

// TestAFullSlabPoolKeepsItsLargestSlabs: a pool holds at most
// maxPooledSlabs, an empty slab is never pooled, and a full pool trades
// its smallest slab for a larger one, so small slabs cannot crowd out the
// ones every delivery can use.
func TestAFullSlabPoolKeepsItsLargestSlabs(t *testing.T) {
	var p slabPool
	p.get(0).Release()
	require.Empty(t, p.mu.free, "an empty slab is not pooled")
	small := make([]*resolvedSlab, maxPooledSlabs+4)
	for i := range small {
		small[i] = p.get(1) // held at once: none reused
	}
	for _, s := range small {
		s.Release()
	}
	require.Len(t, p.mu.free, maxPooledSlabs, "a burst of releases keeps at most maxPooledSlabs")
	large := &resolvedSlab{entries: make([]messaging.Resolved, 0, 512), pool: &p}
	large.refs.Store(1)
	large.Release()
	require.Len(t, p.mu.free, maxPooledSlabs)
	got := p.get(300)
	require.Same(t, large, got, "the large slab displaced a small one")
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
